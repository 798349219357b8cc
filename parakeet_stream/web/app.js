// Live captions page: microphone -> parakeet-stream server -> captions.
//
// Page URL parameters: ?api_key=KEY (passed on to the WebSocket URL when the server
// requires a key), ?lookahead=L,R (an attention-context mode the model offers).

import { Captions } from "./captions.js";
import { CaptionClient, serverInfo } from "./client.js";
import { Microphone } from "./mic.js";

const $ = (id) => document.getElementById(id);
const ui = {
  button: $("toggle"),
  status: $("status"),
  model: $("model"),
  latency: $("latency"),
  sent: $("sent"),
  level: $("level"),
};
const captions = new Captions($("captions"));

let session = null;

function setState(state, detail) {
  document.body.dataset.state = state;
  ui.status.textContent = detail;
  const busy = ["connecting", "queued", "listening"].includes(state);
  ui.button.textContent = busy ? "Stop" : "Start";
  ui.button.disabled = state === "finishing";
  ui.button.setAttribute("aria-pressed", String(busy));
}

class LatencyMeter {
  constructor() {
    this.recent = [];
    this.server = null;
  }

  add(endToEnd, server) {
    if (server != null) this.server = server;
    if (endToEnd == null) return;
    this.recent.push(endToEnd);
    if (this.recent.length > 50) this.recent.shift();
    const sorted = [...this.recent].sort((a, b) => a - b);
    const median = sorted[Math.floor(sorted.length / 2)];
    const ms = (s) => `${Math.round(s * 1000)} ms`;
    ui.latency.textContent =
      `${ms(endToEnd)} (median ${ms(median)})` + (this.server != null ? ` · server ${ms(this.server)}` : "");
    ui.latency.dataset.seconds = String(endToEnd);
  }
}

class Session {
  constructor() {
    this.mic = null;
    this.client = null;
    this.stopped = false;
    this.latency = new LatencyMeter();
  }

  async start() {
    captions.clear();
    ui.latency.textContent = "–";
    ui.sent.textContent = "0.0 s";
    ui.sent.dataset.seconds = "0";
    setState("connecting", "opening the microphone");
    const info = await serverInfo();
    this.mic = new Microphone((pcm, level) => this.packet(pcm, level));
    const rate = await this.mic.open();
    if (this.stopped) {
      await this.end();
      setState("idle", "stopped");
      return;
    }
    this.client = new CaptionClient(info.url, {
      sampleRate: rate,
      lookahead: info.lookahead,
      handlers: {
        onState: (state, detail) => setState(state, detail),
        onHello: (msg) => {
          ui.model.textContent = `${msg.model} · stream ${msg.stream_id} · ${msg.sample_rate} Hz → ${msg.model_sample_rate} Hz`;
        },
        onResult: (msg, endToEnd) => this.result(msg, endToEnd),
        onError: (msg) => console.warn("server error", msg.code, msg.message),
        onEnd: () => this.end(),
      },
    });
    this.client.connect();
  }

  packet(pcm, level) {
    if (!this.client) return;
    this.client.sendAudio(pcm);
    const seconds = this.client.sentSamples / this.client.sampleRate;
    ui.sent.textContent = `${seconds.toFixed(1)} s`;
    ui.sent.dataset.seconds = String(seconds);
    ui.level.value = Math.min(1, Math.sqrt(level) * 2);
  }

  result(msg, endToEnd) {
    captions.append(msg.delta);
    if (typeof msg.text === "string" && msg.text.trim() !== captions.transcript.trim()) {
      console.error("captions out of sync with the server's transcript", msg.text, captions.transcript);
    }
    if (msg.utterance_end || msg.is_final) captions.endUtterance();
    this.latency.add(endToEnd, msg.latency);
  }

  /** Stop button: send every captured sample, then the end of the stream. */
  async stop() {
    if (this.stopped) return;
    this.stopped = true;
    if (!this.client) return;
    setState("finishing", "finishing: waiting for the final result");
    await this.mic.flush();
    this.client.finish();
    await this.mic.close();
    ui.level.value = 0;
  }

  async end() {
    this.stopped = true;
    await this.mic?.close();
    ui.level.value = 0;
    if (session === this) session = null;
  }
}

ui.button.addEventListener("click", async () => {
  if (session) {
    await session.stop();
    return;
  }
  session = new Session();
  try {
    await session.start();
  } catch (error) {
    const current = session;
    session = null;
    await current?.end();
    setState("error", error.name === "NotAllowedError" ? "microphone access was denied" : `error: ${error.message}`);
  }
});

async function init() {
  try {
    const { health } = await serverInfo();
    ui.model.textContent = `${health.model} · ${health.free_slots} of ${health.max_num_streams} slots free`;
    $("demo-notice").hidden = !health.demo_model;
    const ready = health.demo_model ? "ready: press Start (demo model: synthetic speech only)" : "ready: press Start and speak";
    setState("idle", health.status === "ok" ? ready : `server is ${health.status}`);
  } catch (error) {
    setState("error", `cannot reach the server: ${error.message}`);
  }
  ui.button.disabled = false;
}

init();
