"""The languages a model transcribes, and which one a stream asks for.

A multilingual model (nemotron-3.5-asr) is told each stream's language through a prompt
(model/prompt.py): a language-locale of its prompt dictionary ("de-DE"), or "auto", its automatic
language identification. A request names a locale in any case, with "-" or "_" ("de_de"), or a
bare language ("de": the model's first locale of it). A model without prompts transcribes its one
language, English: it takes no language, "en" or any "en-*", and nothing else.
"""

from __future__ import annotations

from .errors import EngineError

AUTO = "auto"
PLAIN = "en"  # the language of the models without prompts


class Languages:
    def __init__(self, names: tuple[str, ...] = ()):
        """names: the model's prompt names (PromptConfig.languages); none for a model without prompts."""
        self.names = tuple(names)
        self.default: str | None = None
        if self.names:
            self.default = AUTO if AUTO in self.names else self.names[0]

    @property
    def multilingual(self) -> bool:
        return bool(self.names)

    def resolve(self, requested: str | None) -> str | None:
        """The prompt name a request means (None: the model has no prompts); EngineError
        `unsupported_language` naming the choices otherwise."""
        if requested is None:
            return self.default
        key = str(requested).strip().replace("_", "-").lower()
        if not self.multilingual:
            if key == PLAIN or key.startswith(PLAIN + "-"):
                return None
            raise EngineError("unsupported_language",
                              f"language {str(requested)[:40]!r}: this model transcribes English (en)")
        for name in self.names:
            if name.lower() == key:
                return name
        for name in self.names:
            if name.lower().split("-")[0] == key:
                return name
        raise EngineError("unsupported_language",
                          f"language {str(requested)[:40]!r}: expected one of {', '.join(self.names)}")
