// AudioWorklet: one ring buffer of 24 kHz mono samples, fed with Int16 or Float32 chunks.
// Reports the first sample actually played, the played-sample count, and the output's RMS;
// after a stop, "faded" once the fade is over (from then on it plays nothing until a reset).
class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.capacity = 24000 * 120; // two minutes of audio
    this.ring = new Float32Array(this.capacity);
    this.read = 0;
    this.write = 0;
    this.played = 0;
    this.started = false;
    this.fade = 0; // samples left in a fade-out; then the buffer is dropped
    this.stopped = false; // stopped: what comes after is dropped
    this.fadeLength = 0;
    this.blocks = 0;
    this.maxRms = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  get available() {
    return this.write - this.read;
  }

  onMessage(msg) {
    if ((msg.type === "pcm16" || msg.type === "f32") && !this.stopped) {
      const src = msg.type === "pcm16" ? new Int16Array(msg.buffer) : new Float32Array(msg.buffer);
      const scale = msg.type === "pcm16" ? 1 / 32768 : 1;
      for (let i = 0; i < src.length; i++) {
        if (this.available >= this.capacity) break; // full: drop rather than overwrite
        this.ring[this.write % this.capacity] = src[i] * scale;
        this.write++;
      }
    } else if (msg.type === "stop" && !this.stopped) {
      this.stopped = true;
      this.fadeLength = this.fade = Math.max(1, Math.round(sampleRate * (msg.fadeMs || 15) / 1000));
      if (this.available === 0) this.faded(); // nothing left to fade
    } else if (msg.type === "reset") {
      this.read = this.write = 0;
      this.started = false;
      this.fade = 0;
      this.stopped = false;
    }
  }

  // The fade is over and the queue dropped: said with the count and loudness up to here, so
  // that every later tick reports only what played after it (nothing, until a reset)
  faded() {
    this.fade = 0;
    this.read = this.write;
    this.port.postMessage({ type: "faded", played: this.played, rms: this.maxRms });
    this.maxRms = 0;
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let energy = 0;
    let faded = false;
    for (let i = 0; i < out.length; i++) {
      let s = 0;
      if (this.available > 0) {
        s = this.ring[this.read % this.capacity];
        this.read++;
        this.played++;
        if (this.fade > 0) {
          s *= this.fade / this.fadeLength;
          this.fade--;
          if (this.fade === 0) {
            this.read = this.write; // faded out: drop the rest
            faded = true;
          }
        }
      } else if (this.fade > 0) { // the queue ran out within the fade
        faded = true;
      }
      out[i] = s;
      energy += s * s;
    }
    if (!this.started && this.played > 0) {
      this.started = true;
      this.port.postMessage({ type: "started", currentTime });
    }
    this.maxRms = Math.max(this.maxRms, Math.sqrt(energy / out.length));
    if (faded) this.faded();
    if (++this.blocks % 16 === 0) { // about every 85 ms
      this.port.postMessage({ type: "tick", played: this.played, queued: this.available, rms: this.maxRms });
      this.maxRms = 0;
    }
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayer);
