"""Models by Hugging Face name: `--model ORG/NAME[@REVISION]`, with `small` and `large` as aliases.

The first use downloads the repository's `.nemo` checkpoint with huggingface_hub (its cache,
progress bars, HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE apply) and converts it once into a
model folder kept beside the hub's own cache:

    $HF_HOME/parakeet-stream/models--ORG--NAME/refs/REVISION   the commit REVISION pointed to
    $HF_HOME/parakeet-stream/models--ORG--NAME/COMMIT/         config.json, model.safetensors, tokenizer.model

HF_HOME defaults to $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. Later uses find the
folder through refs/ without touching the network (`parakeet-convert ORG/NAME` asks the hub
again and converts a newer commit). Before the weights move, the checkpoint's model_config.yaml
is read with range requests (a .nemo is a tar archive), so an unsupported model is refused
early. A folder appears by one rename once complete, so an interrupted download or conversion,
or a full disk, leaves no entry behind (huggingface_hub drops its partial download as well).
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import yaml

from .config import UnsupportedModel
from .convert import ConvertError, convert_nemo, model_config
from .errors import ModelNotFound
from .registry import HUB_ALIASES as ALIASES

REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
REVISION = re.compile(r"[\w.-]+(/[\w.-]+)*")
COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_TAR_MEMBERS = 64
GIB = 1 << 30


class HubError(ModelNotFound):
    """A model name that cannot be had from the hub; the message is one line for users."""

    unreachable = False


class HubUnreachable(HubError):
    """No network (or HF_HUB_OFFLINE) and the model is not in the cache."""

    unreachable = True


def is_hub_name(name: str) -> bool:
    """`small`, `large`, or ORG/NAME with an optional @REVISION."""
    repo, at, revision = ALIASES.get(name, name).partition("@")
    if repo.endswith(".nemo"):  # a checkpoint path, not a repository
        return False
    return bool(REPO.fullmatch(repo)) and (not at or _valid_revision(revision))


def _valid_revision(revision: str) -> bool:
    return bool(REVISION.fullmatch(revision)) and ".." not in revision


def parse(name: str) -> tuple[str, str]:
    """(repo id, revision) of a hub name; the revision defaults to main."""
    if not is_hub_name(name):
        raise HubError(f"{name!r} is not a model name (expected ORG/NAME or ORG/NAME@REVISION)")
    repo, _, revision = ALIASES.get(name, name).partition("@")
    return repo, revision or "main"


def cache_root() -> Path:
    """The converted-model cache, beside the hub's: $HF_HOME/parakeet-stream."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "parakeet-stream"


def _repo_dir(repo: str) -> Path:
    return cache_root() / ("models--" + repo.replace("/", "--"))


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.model"))


def cached(name: str) -> Path | None:
    """The converted folder for a hub name if the cache has it; never touches the network."""
    repo, revision = parse(name)
    commit = revision if COMMIT.fullmatch(revision) else _ref(repo, revision)
    folder = _repo_dir(repo) / commit if commit else None
    return folder if folder is not None and _complete(folder) else None


def resolve(name: str, refresh: bool = False) -> Path:
    """The model folder for a hub name: from the cache, or downloaded and converted into it.

    `refresh` asks the hub which commit the revision points to even when the cache has one.
    """
    repo, revision = parse(name)
    if not refresh and (folder := cached(name)):
        return folder
    _check_online(repo)
    commit, filename, size = remote_checkpoint(repo, revision)
    folder = _repo_dir(repo) / commit
    if not _complete(folder):
        nemo = download_checkpoint(repo, commit, filename, size, converted_dir=folder.parent)
        _convert_into(nemo, folder, f"{repo}@{commit[:12]}")
    _write_ref(repo, revision, commit)
    return folder


def download(name: str) -> Path:
    """The local path of a hub model's .nemo checkpoint (downloaded once into the hub's cache)."""
    repo, revision = parse(name)
    _check_online(repo)
    commit, filename, size = remote_checkpoint(repo, revision)
    return download_checkpoint(repo, commit, filename, size)


def checkpoint(name: str, check: Callable[[dict, str], object]) -> Path:
    """A hub repository's .nemo checkpoint as it is, not converted (the diarizer's): from the cache
    without network once it was downloaded, else downloaded (its config checked by `check` first)."""
    repo, revision = parse(name)
    commit = revision if COMMIT.fullmatch(revision) else _ref(repo, revision)
    link = _repo_dir(repo) / commit / "checkpoint.nemo" if commit else None
    if link is not None and link.is_file():
        return link
    _check_online(repo)
    commit, filename, size = remote_checkpoint(repo, revision)
    nemo = download_checkpoint(repo, commit, filename, size, check=check)
    link = _repo_dir(repo) / commit / "checkpoint.nemo"
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(nemo.resolve())
    except OSError as exc:
        raise HubError(f"cannot write the model cache {cache_root()}: {_reason(exc)}") from None
    _write_ref(repo, revision, commit)
    return link


def _ref(repo: str, revision: str) -> str | None:
    ref = _repo_dir(repo) / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else None
    return commit if commit and COMMIT.fullmatch(commit) else None


def remote_checkpoint(repo: str, revision: str) -> tuple[str, str, int | None]:
    """(commit, .nemo file name, its size) that `revision` of `repo` points to, asked of the hub."""
    from huggingface_hub import HfApi

    with _hub_errors(repo, revision):
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    nemos = sorted((s for s in info.siblings or () if s.rfilename.endswith(".nemo")), key=lambda s: s.rfilename)
    if not nemos:
        raise HubError(f"{repo}: the repository has no .nemo checkpoint (only NeMo RNN-T models can be served)")
    if not info.sha or not COMMIT.fullmatch(info.sha):
        raise HubError(f"{repo}: the hub did not name the commit of {revision!r}")
    return info.sha, nemos[0].rfilename, nemos[0].size


def download_checkpoint(
    repo: str, commit: str, filename: str, size: int | None, converted_dir: Path | None = None,
    check: Callable[[dict, str], object] = model_config,
) -> Path:
    """Check the checkpoint's config (`check` raises for a model this server does not run), then
    download it; refuses unsupported models and full disks first."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    local = try_to_load_from_cache(repo, filename, revision=commit)
    if isinstance(local, str):
        _check_space(size, [converted_dir])
        return Path(local)
    cfg = read_remote_config(repo, commit, filename)
    if cfg is not None:

        try:
            check(cfg, repo)
        except (ConvertError, UnsupportedModel) as exc:
            raise HubError(str(exc)) from None
    _check_space(size, [_hub_cache(), converted_dir])
    print(f"downloading {repo} ({filename}, {_size(size)}) from {_endpoint()}", file=sys.stderr, flush=True)
    with _hub_errors(repo, commit, downloading=True):
        return Path(hf_hub_download(repo, filename, revision=commit))


def read_remote_config(repo: str, commit: str, filename: str) -> dict | None:
    """model_config.yaml of a remote .nemo, read by walking its tar headers with range requests.

    None where that is not possible (a compressed archive, a server that ignores Range).
    """
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, filename, revision=commit)
    offset = 0
    with _hub_errors(repo, commit):
        for _ in range(MAX_TAR_MEMBERS):
            header = _read_range(url, offset, tarfile.BLOCKSIZE)
            if header is None or len(header) < tarfile.BLOCKSIZE or not header.strip(b"\0"):
                return None
            try:
                member = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                return None  # not a plain tar: the config is checked after the download
            start = offset + tarfile.BLOCKSIZE
            if member.isfile() and member.name.removeprefix("./") == "model_config.yaml":
                data = _read_range(url, start, member.size)
                return yaml.safe_load(data) if data is not None and len(data) == member.size else None
            offset = start + math.ceil(member.size / tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    return None


def _read_range(url: str, start: int, length: int) -> bytes | None:
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers() | {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=30) as response:
        hf_raise_for_status(response)
        if response.status_code != 206:
            return None  # the whole file would follow: leave it to the download
        return response.read()


def _convert_into(nemo: Path, folder: Path, label: str) -> None:

    print(f"converting {label} into {folder}", file=sys.stderr, flush=True)
    try:
        convert_nemo(nemo, folder, label)
    except ConvertError as exc:
        if not _complete(folder):  # (a complete folder: another process converted it meanwhile)
            raise HubError(str(exc)) from None


def _write_ref(repo: str, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = _repo_dir(repo) / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}")
        tmp.write_text(commit)
        os.replace(tmp, ref)
    except OSError as exc:
        raise HubError(f"cannot write the model cache {cache_root()}: {_reason(exc)}") from None


def _check_online(repo: str) -> None:
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise HubUnreachable(f"{repo} is not in the model cache ({cache_root()}) and HF_HUB_OFFLINE is set: "
                             "run once with network access")


def _check_space(size: int | None, folders: list[Path | None]) -> None:
    """Refuse before downloading when `size` bytes per folder (same disk: summed) do not fit."""
    if not size:
        return
    need: dict[int, tuple[Path, int]] = {}
    for folder in filter(None, folders):
        existing = _existing_parent(folder)
        device = existing.stat().st_dev
        need[device] = (existing, need.get(device, (existing, 0))[1] + size)
    for existing, total in need.values():
        free = shutil.disk_usage(existing).free
        if free < total:
            raise HubError(f"not enough disk space in {existing}: the model needs {_size(total)}, {_size(free)} free")


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _size(size: int | None) -> str:
    if size is None:
        return "size unknown"
    return f"{size / GIB:.1f} GB" if size >= GIB / 10 else f"{size / (1 << 20):.1f} MB"


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    return exc.strerror or str(exc).splitlines()[0]


@contextmanager
def _hub_errors(repo: str, revision: str, downloading: bool = False):
    """huggingface_hub's and the network's exceptions -> one-line HubError.

    (hf_hub_download turns a failed first request into LocalEntryNotFoundError, so a network
    error that reaches us from it happened mid-file.)
    """
    import httpx2
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise HubError(f"{repo} is gated: accept its terms on the model page and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{repo}: no such model on {_endpoint()} (a private one needs HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{repo}: no revision {revision!r}") from None
    except errors.RemoteEntryNotFoundError:
        raise HubError(f"{repo}: a file vanished from revision {revision!r} while downloading") from None
    except httpx2.TransportError as exc:
        if downloading:
            raise HubUnreachable(f"the download of {repo} was interrupted ({_short(exc)}); run the command again") from None
        raise HubUnreachable(f"cannot reach {_endpoint()} to download {repo} ({_short(exc)})") from None
    except (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError) as exc:
        raise HubUnreachable(f"cannot reach {_endpoint()} to download {repo} ({_short(exc)})") from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(f"{repo}: the hub answered HTTP {status}") from None
    except OSError as exc:
        raise HubError(f"{repo}: download failed: {_reason(exc)}") from None


def _short(exc: BaseException) -> str:
    while exc.__cause__ is not None:  # the network error under huggingface_hub's own
        exc = exc.__cause__
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
