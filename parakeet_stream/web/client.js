// The native parakeet-stream protocol over WebSocket (docs/protocol.md), as the page uses it:
// a `start` message declaring the capture rate, binary PCM16 frames, a final empty `audio`
// message; `queued`, `hello`, `result`, `error` and `closed` messages back.

/** The server's WebSocket URL, learned from its own /health (same host, the `ws` port). */
export async function serverInfo(location = window.location) {
  const response = await fetch("/health", { cache: "no-store" });
  if (!response.ok) throw new Error(`/health answered HTTP ${response.status}`);
  const health = await response.json();
  const port = health.ports?.ws;
  if (!port) throw new Error("the server did not report its WebSocket port");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = new URL(`${scheme}://${location.hostname}:${port}/`);
  const page = new URLSearchParams(location.search);
  // browsers cannot set an Authorization header on a WebSocket: the key goes in the URL
  if (page.get("api_key")) url.searchParams.set("api_key", page.get("api_key"));
  return { url: url.href, health, lookahead: page.get("lookahead") };
}

/**
 * One stream. Handlers (all optional): onState(state, detail), onHello(msg), onResult(msg,
 * endToEndSeconds), onError(msg), onEnd(summary).
 * States: connecting, queued, listening, finishing, done, error.
 */
export class CaptionClient {
  constructor(url, { sampleRate, lookahead = null, handlers = {} }) {
    this.url = url;
    this.sampleRate = sampleRate;
    this.lookahead = lookahead;
    this.handlers = handlers;
    this.outbox = []; // frames waiting for the socket to open
    this.sentSamples = 0;
    this.marks = []; // [{seconds, time}]: when the stream's audio reached `seconds`
    this.finishing = false;
    this.gotFinal = false;
    this.opened = false;
    this.lastError = null;
    this.finalError = null;
    this.closedReason = null;
  }

  connect() {
    this.emit("onState", "connecting", "connecting to the server");
    const ws = (this.ws = new WebSocket(this.url));
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      this.opened = true;
      const start = { type: "start", sample_rate: this.sampleRate, encoding: "pcm16" };
      if (this.lookahead) start.lookahead = this.lookahead;
      ws.send(JSON.stringify(start));
      for (const frame of this.outbox) this.transmit(frame);
      this.outbox = [];
      if (!this.finishing) this.emit("onState", "connecting", "connected, waiting for the server");
    };
    ws.onmessage = (event) => {
      if (typeof event.data === "string") this.receive(JSON.parse(event.data));
    };
    ws.onclose = (event) => this.closed(event);
  }

  /** Queue one PCM16 packet (ArrayBuffer) at the declared rate. */
  sendAudio(pcm) {
    if (this.finishing) return;
    this.send(pcm);
  }

  /** End of audio: the server answers with the final result, then closes. */
  finish() {
    if (this.finishing) return;
    this.send(JSON.stringify({ type: "audio", data: "", encoding: "pcm16", final: true }));
    this.finishing = true;
    if (!this.gotFinal) this.emit("onState", "finishing", "finishing: waiting for the final result");
  }

  /** Drop the connection without waiting for the final result. */
  abort() {
    this.finishing = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "client stopped");
  }

  send(frame) {
    if (this.ws?.readyState === WebSocket.OPEN) this.transmit(frame);
    else if (!this.ws || this.ws.readyState === WebSocket.CONNECTING) this.outbox.push(frame);
  }

  transmit(frame) {
    this.ws.send(frame);
    if (frame instanceof ArrayBuffer) {
      this.sentSamples += frame.byteLength / 2;
      this.marks.push({ seconds: this.sentSamples / this.sampleRate, time: performance.now() });
    }
  }

  receive(msg) {
    switch (msg.type) {
      case "queued": {
        const wait = msg.estimated_wait_s != null ? `, about ${Math.round(msg.estimated_wait_s)} s` : "";
        this.emit("onState", "queued", `waiting, position ${msg.position}${wait}`);
        break;
      }
      case "started": // the answer to `start`; may come while still queued
        this.emit("onHello", msg);
        break;
      case "hello": // admitted: a slot is ours
        this.emit("onHello", msg);
        if (!this.finishing) this.emit("onState", "listening", "listening");
        break;
      case "result":
        this.emit("onResult", msg, msg.is_final ? null : this.endToEnd(msg.audio_seconds));
        if (msg.is_final) {
          this.gotFinal = true;
          this.finalError = msg.error || null;
          this.emit("onState", "done", msg.error ? "the server failed on this stream" : "finished");
        }
        break;
      case "error":
        this.lastError = msg;
        this.emit("onError", msg);
        break;
      case "closed":
        this.closedReason = msg.reason;
        break;
      default:
        break; // pong and future message types
    }
  }

  /** Seconds from sending the last audio this result covers to receiving the result. */
  endToEnd(audioSeconds) {
    if (audioSeconds == null) return null;
    const now = performance.now();
    let index = this.marks.findIndex((mark) => mark.seconds >= audioSeconds - 1e-6);
    if (index < 0) return null;
    const seconds = (now - this.marks[index].time) / 1000;
    this.marks.splice(0, index); // later results cover later audio
    return seconds;
  }

  closed(event) {
    let summary;
    if (!this.opened) {
      summary = "the server refused the connection (wrong or missing api_key, or this page's origin is not allowed)";
    } else if (this.finalError) {
      summary = "the server failed on this stream (inference_error)";
    } else if (this.gotFinal) {
      summary = this.closedReason ? `finished (${this.closedReason.replace(/_/g, " ")})` : "finished";
    } else if (this.lastError) {
      summary = `${this.lastError.code}: ${this.lastError.message}`;
    } else if (event.code === 1013) {
      summary = "the server is full, try again later";
    } else {
      summary = `connection closed (${event.code}${event.reason ? " " + event.reason : ""})`;
    }
    const ok = this.gotFinal && !this.finalError;
    if (!ok) this.emit("onState", "error", summary);
    else this.emit("onState", "done", summary);
    this.emit("onEnd", { ok, summary });
  }

  emit(name, ...args) {
    this.handlers[name]?.(...args);
  }
}
