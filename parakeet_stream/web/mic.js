// Microphone capture: getUserMedia -> MediaStreamSource -> AudioWorklet (capture-worklet.js).
//
// The worklet hands back PCM16 packets at the microphone's rate (usually 44.1 or 48 kHz),
// which the page declares in its `start` message; the server resamples to the model's rate.

const PACKET_SECONDS = 0.04; // 40 ms per WebSocket frame

export class Microphone {
  /** @param {(pcm: ArrayBuffer, level: number) => void} onPacket */
  constructor(onPacket) {
    this.onPacket = onPacket;
    this.stream = null;
    this.context = null;
    this.node = null;
    this.flushed = null;
  }

  /** Opens the microphone and starts capturing; resolves to the capture sample rate. */
  async open() {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new Error("this browser cannot capture audio here (a page must be served from localhost or https)");
    }
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: {
        channelCount: 1,
        // speech recognition wants the signal as spoken: no echo cancelling, noise gating
        // or gain riding, which reshape the audio the model was trained on
        echoCancellation: false,
        noiseSuppression: false,
        autoGainControl: false,
      },
    });
    // Run the audio graph at the microphone's own rate: no resampling in the browser (the
    // server resamples once, with a good filter), and Firefox needs the rates to match.
    const trackRate = this.stream.getAudioTracks()[0]?.getSettings().sampleRate;
    try {
      this.context = new AudioContext({ latencyHint: "interactive", sampleRate: trackRate || undefined });
    } catch {
      this.context = new AudioContext({ latencyHint: "interactive" });
    }
    await this.context.audioWorklet.addModule(new URL("capture-worklet.js", import.meta.url));
    const source = this.context.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(this.context, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      channelCount: 1,
      channelCountMode: "explicit", // a stereo microphone is mixed down to mono
      processorOptions: { packetSamples: Math.round(this.context.sampleRate * PACKET_SECONDS) },
    });
    this.node.port.onmessage = (event) => {
      const { pcm, level, flushed } = event.data;
      if (pcm) this.onPacket(pcm, level);
      if (flushed && this.flushed) this.flushed();
    };
    source.connect(this.node);
    // The processor writes silence; connecting it to the output keeps it rendering.
    this.node.connect(this.context.destination);
    if (this.context.state !== "running") await this.context.resume();
    return this.context.sampleRate;
  }

  /** Resolves once every captured sample has been handed to onPacket. */
  flush() {
    if (!this.node) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, 1000); // a suspended context never answers
      this.flushed = () => {
        clearTimeout(timer);
        this.flushed = null;
        resolve();
      };
      this.node.port.postMessage({ type: "flush" });
    });
  }

  /** Releases the microphone (its indicator goes off); safe to call more than once. */
  async close() {
    const { stream, node, context } = this;
    this.stream = this.context = this.node = null;
    stream?.getTracks().forEach((track) => track.stop());
    if (node) {
      node.port.postMessage({ type: "stop" });
      node.port.onmessage = null;
      node.disconnect();
    }
    if (context && context.state !== "closed") await context.close().catch(() => {});
  }
}
