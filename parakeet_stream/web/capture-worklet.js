// AudioWorklet processor: the microphone's first channel as little-endian PCM16 packets.
//
// Runs on the audio rendering thread. Every `packetSamples` input samples it posts
// {pcm: ArrayBuffer (Int16, transferred), level: RMS of the packet} to the main thread.
// A {type: "flush"} message posts the partial packet (if any) and then {flushed: true},
// so that the page can send every captured sample before it ends the stream.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const requested = options.processorOptions?.packetSamples;
    this.packetSamples = Math.max(128, Math.floor(requested || sampleRate * 0.04));
    this.packet = new Int16Array(this.packetSamples);
    this.filled = 0;
    this.sumSquares = 0;
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data?.type === "flush") {
        this.post();
        this.port.postMessage({ flushed: true });
      } else if (event.data?.type === "stop") {
        this.running = false;
      }
    };
  }

  process(inputs) {
    const channel = inputs[0]?.[0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        const s = Math.max(-1, Math.min(1, channel[i]));
        this.sumSquares += s * s;
        this.packet[this.filled++] = Math.round(s < 0 ? s * 32768 : s * 32767);
        if (this.filled === this.packetSamples) this.post();
      }
    }
    return this.running;
  }

  post() {
    if (this.filled === 0) return;
    const pcm = this.packet.slice(0, this.filled).buffer;
    const level = Math.sqrt(this.sumSquares / this.filled);
    this.port.postMessage({ pcm, level }, [pcm]);
    this.filled = 0;
    this.sumSquares = 0;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
