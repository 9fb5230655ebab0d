// speak.js: stream a voice reply from the gateway and play it as it arrives.
// No dependencies. One API over three transports and four formats:
//
//   import { Speaker } from "/static/speak.js";
//   const speaker = new Speaker({ transport: "ws" });        // "sse" | "sse-fetch" | "ws"
//   speaker.addEventListener("text", (e) => console.log(e.detail.text));
//   const stats = await speaker.speak({ text: "Hello there.", format: "mp3", mode: "bidi" });
//   speaker.stop();                                           // barge-in
//
// Over "ws" the connection stays open between replies; when the gateway restarts (it closes
// with 1012 once the reply in progress has finished) or the connection breaks, the speaker
// connects again by itself with backoff, emitting "reconnecting" {attempt, delayMs, code} and
// "reconnected" {attempts}.
//
// A gateway with API keys wants a token: `new Speaker({ token })`, where `token` is a string or
// an async function that asks the page's own backend for a fresh one (POST /v1/tokens there,
// with the key; tokens live 15 minutes). It goes in `?token=` for EventSource and WebSocket,
// which cannot set headers, and in `Authorization: Bearer` for fetch.
//
// pcm plays through one AudioWorklet ring buffer; mp3/aac/opus through Media Source
// Extensions, or, where MSE lacks the type (Firefox has no MP3 in MSE), WebCodecs'
// AudioDecoder feeding the same worklet. `stats.ttfaMs` is the time to the first sample the
// listener hears, not to the first byte.

export const MSE_TYPES = {
  mp3: "audio/mpeg",
  aac: 'audio/mp4; codecs="mp4a.40.2"',
  opus: 'audio/webm; codecs="opus"',
};
const SAMPLE_RATE = 24000;
const EVENT_NAMES = ["agent_start", "audio_stream_start", "text_delta", "audio_chunk", "words",
  "audio_stream_end", "agent_end", "error", "cancelled"];

function b64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// --- players --------------------------------------------------------------------------------

let sharedContext = null;
async function audioContext(workletUrl) {
  if (!sharedContext) {
    const ctx = new AudioContext({ sampleRate: SAMPLE_RATE });
    await ctx.audioWorklet.addModule(workletUrl);
    sharedContext = ctx;
  }
  if (sharedContext.state === "suspended") await sharedContext.resume();
  return sharedContext;
}

class WorkletPlayer {
  constructor(ctx, stats, onHeard) {
    this.ctx = ctx;
    this.stats = stats;
    this.node = new AudioWorkletNode(ctx, "pcm-player", { outputChannelCount: [1] });
    this.analyser = ctx.createAnalyser();
    this.node.connect(this.analyser);
    this.analyser.connect(ctx.destination);
    this.odd = null;
    this.queued = 0;
    this.received = false;
    this.drained = null;
    this.stats.contextTimeStart = ctx.currentTime;
    this.node.port.onmessage = (e) => {
      const m = e.data;
      if (m.type === "started") onHeard();
      if (m.type === "tick") {
        this.queued = m.queued;
        this.tickAt = ctx.currentTime;
        this.stats.playedSamples = m.played;
        this.stats.maxRms = Math.max(this.stats.maxRms, m.rms);
        this.stats.contextTimeEnd = ctx.currentTime;
        if (this.drained && m.queued === 0 && this.received) this.drained();
      }
    };
  }

  // Milliseconds of the utterance heard so far, from the audio clock: the worklet's last count
  // of played samples, carried forward by the context's time since (never past what is queued).
  playedMs() {
    const played = this.stats.playedSamples || 0;
    if (this.stopped || this.tickAt === undefined) return played / (SAMPLE_RATE / 1000);
    const since = Math.max(0, this.ctx.currentTime - this.tickAt) * SAMPLE_RATE;
    return (played + Math.min(since, this.queued)) / (SAMPLE_RATE / 1000);
  }

  push(bytes) { // s16le PCM, cut anywhere
    let data = bytes;
    if (this.odd !== null) {
      data = new Uint8Array(bytes.length + 1);
      data[0] = this.odd;
      data.set(bytes, 1);
      this.odd = null;
    }
    if (data.length % 2) {
      this.odd = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    const copy = data.slice().buffer;
    this.received = true;
    this.node.port.postMessage({ type: "pcm16", buffer: copy }, [copy]);
  }

  pushFloat32(samples) {
    const copy = samples.slice().buffer;
    this.received = true;
    this.node.port.postMessage({ type: "f32", buffer: copy }, [copy]);
  }

  end() {
    return new Promise((resolve) => { this.drained = resolve; });
  }

  stop() { // fade out over 15 ms and drop what is queued; the node stays until release()
    this.stopped = true;
    this.node.port.postMessage({ type: "stop", fadeMs: 15 });
    if (this.drained) this.drained();
  }

  release() {
    this.node.disconnect();
    this.analyser.disconnect();
  }
}

class MsePlayer {
  constructor(type, stats, onHeard) {
    this.stats = stats;
    this.queue = [];
    this.done = false;
    this.audio = new Audio();
    this.audio.autoplay = true;
    this.source = new MediaSource();
    this.audio.src = URL.createObjectURL(this.source);
    this.audio.addEventListener("playing", () => { stats.playingEvent = true; onHeard(); }, { once: true });
    this.ended = new Promise((resolve) => {
      this.audio.addEventListener("ended", resolve, { once: true });
      this.resolveEnded = resolve;
    });
    this.ready = new Promise((resolve) => {
      this.source.addEventListener("sourceopen", () => {
        this.buffer = this.source.addSourceBuffer(type);
        this.buffer.mode = "sequence";
        this.buffer.addEventListener("updateend", () => this.pump());
        resolve();
      }, { once: true });
    });
  }

  playedMs() {
    return this.audio.currentTime * 1000; // sequence mode: the utterance starts at 0
  }

  async push(bytes) {
    await this.ready;
    this.queue.push(bytes);
    this.pump();
  }

  pump() {
    if (!this.buffer || this.buffer.updating) return;
    const b = this.buffer.buffered;
    if (b.length) this.stats.bufferedEnd = b.end(b.length - 1);
    if (this.queue.length) {
      this.buffer.appendBuffer(this.queue.shift());
      if (this.audio.paused && !this.stopped) this.audio.play().catch(() => {});
    } else if (this.done && this.source.readyState === "open") {
      this.source.endOfStream();
    }
  }

  async end() {
    await this.ready;
    this.done = true;
    this.pump();
    await this.ended;
  }

  release() {
    this.audio.pause();
    this.audio.removeAttribute("src");
    this.audio.load();
  }

  stop() {
    this.stopped = true;
    const audio = this.audio;
    let step = 0;
    const fade = setInterval(() => { // ~20 ms fade, then silence
      step++;
      audio.volume = Math.max(0, 1 - step / 4);
      if (step >= 4) { clearInterval(fade); audio.pause(); this.resolveEnded(); }
    }, 5);
  }
}

// MP3 frame lengths (MPEG-1/2/2.5 layer III), for WebCodecs chunks.
const MP3_RATES = { 3: [44100, 48000, 32000], 2: [22050, 24000, 16000], 0: [11025, 12000, 8000] };
const MP3_KBPS = {
  1: [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
  2: [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
};
export function mp3Frames(bytes) {
  const frames = [];
  let pos = 0;
  while (pos + 4 <= bytes.length) {
    const [b0, b1, b2] = [bytes[pos], bytes[pos + 1], bytes[pos + 2]];
    const version = (b1 >> 3) & 3;
    if (b0 !== 0xff || (b1 & 0xe0) !== 0xe0 || version === 1) break;
    const kbps = MP3_KBPS[version === 3 ? 1 : 2][b2 >> 4];
    const rate = MP3_RATES[version][(b2 >> 2) & 3];
    const len = Math.floor(((version === 3 ? 144 : 72) * kbps * 1000) / rate) + ((b2 >> 1) & 1);
    if (!len || pos + len > bytes.length) break;
    frames.push(bytes.subarray(pos, pos + len));
    pos += len;
  }
  return frames;
}

class WebCodecsMp3Player {
  constructor(worklet) {
    this.worklet = worklet;
    this.timestamp = 0;
    this.decoder = new AudioDecoder({
      output: (data) => {
        const samples = new Float32Array(data.numberOfFrames);
        data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
        data.close();
        this.worklet.pushFloat32(samples);
      },
      error: (e) => console.warn("AudioDecoder:", e.message),
    });
    this.decoder.configure({ codec: "mp3", sampleRate: SAMPLE_RATE, numberOfChannels: 1 });
  }

  push(bytes) {
    for (const frame of mp3Frames(bytes)) {
      this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.timestamp, data: frame }));
      this.timestamp += 24000; // µs per 576-sample frame at 24 kHz
    }
  }

  async end() {
    await this.decoder.flush();
    return this.worklet.end();
  }

  playedMs() {
    return this.worklet.playedMs();
  }

  stop() {
    this.worklet.stop();
    if (this.decoder.state !== "closed") this.decoder.close();
  }

  release() {
    this.worklet.release();
  }
}

// --- SSE over fetch --------------------------------------------------------------------------

async function* sseEvents(body, signal) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) { // event boundaries never align with chunks
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (data.length) yield { event, data: data.join("\n") };
      }
    }
  } finally {
    if (!signal.aborted) reader.releaseLock();
  }
}

// --- the speaker -----------------------------------------------------------------------------

export class Speaker extends EventTarget {
  constructor({ baseUrl = "", transport = "sse", decoder = "auto", workletUrl, token = null } = {}) {
    super();
    this.baseUrl = baseUrl || location.origin;
    this.token = token; // a string, or an async function returning one
    this.transport = transport;
    this.decoder = decoder; // "auto" | "webcodecs" (force the MSE fallback path)
    this.workletUrl = workletUrl || new URL("./pcm-worklet.js", import.meta.url);
    this.ws = null;
    this.current = null;
    this.closed = false;
    this.reconnecting = false;
  }

  async credential() {
    return typeof this.token === "function" ? await this.token() : this.token;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  setState(state) {
    if (!this.current) return;
    this.current.stats.state = state;
    this.emit("state", { state });
  }

  async speak(params) {
    if (this.current) this.stop();
    if (this.lastPlayer) this.lastPlayer.release(); // the previous reply's output, now silent
    this.lastPlayer = null;
    const format = params.format || "mp3";
    const stats = {
      state: "idle", format, transport: this.transport, t0: performance.now(),
      firstTextMs: null, firstAudioBytesMs: null, ttfaMs: null, bytes: 0, chunks: 0,
      audioSeconds: 0, maxRms: 0, playingEvent: false, bufferedEnd: 0, player: null,
      serverMetrics: null, cancelled: false, error: null, playedMs: 0, heardText: null,
    };
    const reply = {
      stats, utteranceId: null, finished: null, abort: null, stopped: false, words: [], word: -1,
    };
    this.current = reply;
    const heard = () => {
      if (stats.ttfaMs === null) {
        stats.ttfaMs = Math.round(performance.now() - stats.t0);
        this.setState("playing");
        this.emit("heard", { ttfaMs: stats.ttfaMs });
      }
    };
    reply.player = this.lastPlayer = await this.makePlayer(format, stats, heard);
    stats.player = reply.player.constructor.name;
    this.emit("player", { player: stats.player });
    const clock = setInterval(() => this.tick(reply), 25);

    const done = new Promise((resolve) => { reply.finished = resolve; });
    const handle = (name, body) => this.onEvent(reply, name, body);
    const query = { mode: "bidi", ...params, format };
    try {
      if (this.transport === "ws") await this.startWs(reply, query, handle);
      else if (this.transport === "sse-fetch") this.startFetch(reply, query, handle, await this.credential());
      else this.startEventSource(reply, { ...query, token: await this.credential() }, handle);
    } catch (err) {
      this.fail(reply, err.message || String(err));
    }
    await done;
    if (!reply.stopped && !stats.error) {
      await reply.player.end();
      if (!reply.stopped) this.setState("done");
    }
    clearInterval(clock);
    this.tick(reply);
    if (reply.cancelling) await reply.cancelling; // what was heard, from the server
    if (this.current === reply) this.current = null;
    return stats;
  }

  // The playback clock: "progress" {playedMs} as the listener hears it, and "word" {index,
  // word, start_ms, end_ms, playedMs} when the word being heard changes (from the audio clock,
  // not from when the timings arrived).
  tick(reply) {
    if (!reply.player.playedMs) return;
    const played = reply.player.playedMs();
    if (played === reply.stats.playedMs) return;
    reply.stats.playedMs = played;
    this.emit("progress", { playedMs: played });
    let index = reply.word;
    while (index + 1 < reply.words.length && reply.words[index + 1].start_ms <= played) index++;
    if (index !== reply.word) {
      reply.word = index;
      this.emit("word", { index, ...reply.words[index], playedMs: played });
    }
  }

  async makePlayer(format, stats, heard) {
    const webcodecs = format === "mp3" && (this.decoder === "webcodecs" || !MediaSource.isTypeSupported(MSE_TYPES.mp3));
    if (format === "pcm" || webcodecs) {
      const worklet = new WorkletPlayer(await audioContext(this.workletUrl), stats, heard);
      return webcodecs ? new WebCodecsMp3Player(worklet) : worklet;
    }
    const type = MSE_TYPES[format];
    if (!type || !MediaSource.isTypeSupported(type)) throw new Error(`format ${format} cannot play here`);
    return new MsePlayer(type, stats, heard);
  }

  onEvent(reply, name, body) {
    const stats = reply.stats;
    const now = Math.round(performance.now() - stats.t0);
    switch (name) {
      case "agent_start":
        reply.utteranceId = body.utterance_id;
        break;
      case "text_delta":
        if (stats.firstTextMs === null) stats.firstTextMs = now;
        this.emit("text", { ...body, t: now });
        break;
      case "audio_chunk": {
        if (reply.stopped) return; // late audio of a cancelled utterance
        const bytes = body.bytes || b64ToBytes(body.data);
        if (stats.firstAudioBytesMs === null) stats.firstAudioBytesMs = now;
        stats.bytes += bytes.length;
        stats.chunks += 1;
        reply.player.push(bytes);
        this.emit("audio", { seq: stats.chunks - 1, bytes: bytes.length, t: now });
        break;
      }
      case "words":
        reply.words.push(...body.words);
        this.emit("words", { words: body.words, first: reply.words.length - body.words.length });
        break;
      case "audio_stream_end":
        stats.audioSeconds = body.duration_s;
        break;
      case "error":
        // the server has ended this reply itself: nothing to cancel
        this.fail(reply, `${body.code}: ${body.message}`, {
          code: body.code, retryable: body.retryable, retryAfterS: body.retry_after_s ?? null,
          ended: true,
        });
        break;
      case "cancelled":
        stats.cancelled = true;
        if (body.heard_text !== undefined) this.heard(reply, body.played_ms, body.heard_text);
        break;
      case "agent_end":
        stats.serverMetrics = body.metrics;
        this.emit("metrics", body.metrics);
        reply.finished();
        break;
    }
  }

  // `error` events carry {message, code, retryable, retryAfterS}; a refusal up front because
  // the service is at capacity (code "overloaded", HTTP 503 with Retry-After) says when to retry.
  fail(reply, message, { code = null, retryable = false, retryAfterS = null, ended = false } = {}) {
    if (reply.stats.error) return; // the first failure is the one to report
    reply.stats.error = message;
    reply.stats.errorCode = code;
    this.setState(code === "overloaded" ? "overloaded" : "error");
    this.emit("error", { message, code, retryable, retryAfterS });
    if (reply.abort && !ended) reply.abort();
    reply.finished();
  }

  heard(reply, playedMs, heardText) {
    if (reply.stats.heardText !== null) return;
    reply.stats.heardText = heardText;
    this.emit("cancelled", { playedMs, heardText });
    if (reply.heardResolve) reply.heardResolve(heardText);
  }

  // Barge-in for the SSE transports: the server stops the reply and says what was heard.
  async cancelHttp(reply, playedMs) {
    const url = new URL(`/v1/speak/${encodeURIComponent(reply.utteranceId)}/cancel`, this.baseUrl);
    const headers = { "Content-Type": "application/json" };
    const token = await this.credential();
    if (token) headers.Authorization = `Bearer ${token}`;
    try {
      const r = await fetch(url, { method: "POST", headers, body: JSON.stringify({ played_ms: playedMs }) });
      const body = r.ok ? await r.json() : null;
      this.heard(reply, playedMs, body ? body.heard_text : null);
    } catch {
      this.heard(reply, playedMs, null);
    }
  }

  startEventSource(reply, query, handle) {
    const url = new URL("/v1/speak/sse", this.baseUrl);
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
    const es = new EventSource(url);
    reply.abort = (playedMs) => {
      if (playedMs === undefined || reply.utteranceId === null) return es.close();
      reply.cancelling = this.cancelHttp(reply, playedMs).finally(() => es.close());
    };
    for (const name of EVENT_NAMES) {
      es.addEventListener(name, (e) => {
        if (name === "error" && !e.data) return; // a transport error, handled below
        const body = JSON.parse(e.data);
        if (name === "agent_end") es.close(); // before EventSource can reconnect and replay
        handle(name, body);
      });
    }
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED && reply.stats.serverMetrics === null && !reply.stopped) {
        // EventSource cannot read a refusal's status or body: fetch SSE and the WebSocket can
        const early = reply.utteranceId === null;
        this.fail(reply, early ? "event stream refused (the service may be at capacity; retry shortly)"
          : "event stream failed", { retryable: early });
      }
    };
  }

  startFetch(reply, query, handle, token) {
    const controller = new AbortController();
    reply.abort = (playedMs) => {
      if (playedMs === undefined || reply.utteranceId === null) return controller.abort();
      reply.cancelling = this.cancelHttp(reply, playedMs).finally(() => controller.abort());
    };
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    if (token) headers.Authorization = `Bearer ${token}`;
    (async () => {
      const response = await fetch(new URL("/v1/speak", this.baseUrl), {
        method: "POST",
        headers,
        body: JSON.stringify(query),
        signal: controller.signal,
      });
      if (!response.ok) {
        const err = await response.json().catch(() => ({ error: { message: response.statusText } }));
        const retryAfter = Number(response.headers.get("Retry-After"));
        if (!reply.stopped) {
          this.fail(reply, `${err.error.code || response.status}: ${err.error.message}`, {
            code: err.error.code || null,
            retryable: Boolean(err.error.retryable),
            retryAfterS: Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : null,
          });
        }
        return;
      }
      for await (const { event, data } of sseEvents(response.body, controller.signal)) handle(event, JSON.parse(data));
    })().catch((err) => {
      if (!reply.stopped) this.fail(reply, err.message || String(err));
    });
  }

  async openWs() {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) return this.ws;
    const url = new URL("/v1/speak/ws", this.baseUrl);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const token = await this.credential();
    if (token) url.searchParams.set("token", token);
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error("WebSocket connection failed"));
    });
    ws.onmessage = (e) => {
      const reply = this.wsReply;
      if (!reply) return;
      if (typeof e.data === "string") {
        const body = JSON.parse(e.data);
        if (body.utterance_id && reply.utteranceId && body.utterance_id !== reply.utteranceId) return;
        if (body.type === "error" && !body.utterance_id && reply.stats.serverMetrics) return;
        reply.handle(body.type, body);
        return;
      }
      const bytes = new Uint8Array(e.data);
      const n = bytes[0];
      const owner = new TextDecoder().decode(bytes.subarray(1, 1 + n));
      if (owner !== reply.utteranceId || reply.stopped) return; // stale audio: drop it
      reply.handle("audio_chunk", { bytes: bytes.subarray(1 + n) });
    };
    ws.onclose = (e) => {
      const reply = this.wsReply;
      if (reply && reply.stats.serverMetrics === null && !reply.stopped) {
        // 1012: the gateway restarts (it lets replies finish first); 1006: the connection broke
        this.fail(reply, "WebSocket closed", { retryable: e.code !== 1000 && e.code !== 1008 });
      }
      this.ws = null;
      if (e.code !== 1000 && !this.closed) this.reconnect(e.code);
    };
    this.ws = ws;
    return ws;
  }

  // The gateway went away (a restart closes with 1012, a crash with 1006): connect again with
  // growing, jittered waits, saying so through "reconnecting" and "reconnected" events.
  async reconnect(code) {
    if (this.reconnecting) return;
    this.reconnecting = true;
    try {
      for (let attempt = 1; !this.closed; attempt++) {
        const delayMs = Math.round(Math.random() * Math.min(5000, 250 * 2 ** (attempt - 1)));
        this.emit("reconnecting", { attempt, delayMs, code });
        await new Promise((resolve) => setTimeout(resolve, delayMs));
        if (this.closed || (this.ws && this.ws.readyState === WebSocket.OPEN)) return;
        try {
          await this.openWs();
          this.emit("reconnected", { attempts: attempt });
          return;
        } catch { /* not back yet */ }
      }
    } finally {
      this.reconnecting = false;
    }
  }

  async startWs(reply, query, handle) {
    const ws = await this.openWs();
    reply.handle = handle;
    reply.utteranceId = `u${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;
    this.wsReply = reply;
    reply.abort = (playedMs) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const cancel = playedMs === undefined ? { type: "cancel" } : { type: "cancel", played_ms: playedMs };
      if (playedMs !== undefined) {
        reply.cancelling = new Promise((resolve) => {
          reply.heardResolve = resolve;
          setTimeout(() => resolve(null), 5000); // a server that never answers
        });
      }
      ws.send(JSON.stringify(cancel));
    };
    ws.send(JSON.stringify({ type: "speak", ...query, utterance_id: reply.utteranceId }));
  }

  // Barge-in: silence at once, and tell the server how much was heard (`played_ms`, from the
  // audio clock); resolves to what the listener heard of it (`heard_text`), or null.
  async stop() {
    const reply = this.current;
    if (!reply) return null;
    const playedMs = Math.round(reply.player.playedMs ? reply.player.playedMs() : 0);
    reply.stats.playedMs = playedMs;
    reply.stopped = true;
    reply.player.stop(); // silence at once (short fade)
    if (reply.abort) reply.abort(playedMs); // cancel on the WebSocket, or through HTTP
    this.setState("stopped");
    reply.finished();
    if (reply.cancelling) await reply.cancelling;
    return reply.stats.heardText;
  }

  close() {
    this.closed = true; // no more reconnects
    if (this.current) this.stop();
    if (this.lastPlayer) this.lastPlayer.release();
    if (this.ws) this.ws.close(1000);
  }
}
