// Caption lines: finalized utterances, then the utterance still being spoken (partial).
// Text is only ever set with textContent: the server's text is never parsed as HTML.

export class Captions {
  /** @param {HTMLElement} element the container of the <p class="caption"> lines */
  constructor(element) {
    this.element = element;
    this.partial = null;
    this.raw = ""; // the partial line's text as received (deltas keep their leading spaces)
    this.transcript = ""; // every delta so far, concatenated: the stream's whole text
  }

  clear() {
    this.element.replaceChildren();
    this.partial = null;
    this.raw = "";
    this.transcript = "";
    this.element.dataset.text = "";
  }

  /** New text for the current utterance. */
  append(delta) {
    if (!delta) return;
    if (!this.partial) {
      this.partial = document.createElement("p");
      this.partial.className = "caption partial";
      this.partial.dir = "auto"; // right-to-left text (Arabic, Hebrew) lays out as such
      this.element.append(this.partial);
    }
    this.raw += delta;
    this.transcript += delta;
    this.element.dataset.text = this.transcript.trim();
    this.partial.textContent = this.raw.trim();
    this.scroll();
  }

  /** The current utterance ended: its line becomes final (an empty one is dropped). */
  endUtterance() {
    if (!this.partial) return;
    if (this.raw.trim()) this.partial.className = "caption final";
    else this.partial.remove();
    this.partial = null;
    this.raw = "";
    this.scroll();
  }

  scroll() {
    this.element.scrollTop = this.element.scrollHeight;
  }
}
