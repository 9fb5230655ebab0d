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
//
// Inside: `Speaker` keeps one transport (`EventSourceTransport`, `SseFetchTransport` or
// `WebSocketTransport`, one interface, below) and makes one `Reply` per `speak()`: the reply
// owns its id, state, figures, player and the gateway's events; the transport only carries
// them. `SseDecoder` is the one SSE parser (pure, text in and events out), what fetch SSE reads
// with; EventSource parses in the browser.

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
      if (m.type === "faded") { // stopped, and silent from here on
        this.queued = 0;
        this.stats.playedSamples = m.played;
        this.stats.maxRms = Math.max(this.stats.maxRms, m.rms);
        this.stats.fadedAt = ctx.currentTime;
      }
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

// --- Server-Sent Events, decoded incrementally ------------------------------------------------

// The one SSE decoder: pure (text in, events out, no I/O), following the WHATWG event-stream
// rules. A line ends with CRLF, LF or CR; a push that ends with a CR may be the first half of a
// CRLF, so the decoder remembers it and a LF at the start of the next push ends nothing. A
// blank line dispatches the event being built, if it has data. Events are `{event, data, id}`
// (`event` is "message" when the stream named none; `id` is the last event id seen). Feed it
// the text of each read as it comes (decode bytes with one streaming TextDecoder first); the
// events do not depend on where the reads were cut. `end()` at the end of the stream drops an
// event no blank line finished, as EventSource does.
export class SseDecoder {
  constructor() {
    this.line = ""; // the line still open at the end of the last push
    this.afterCr = false; // the last push ended with a CR
    this.started = false; // a byte-order mark is skipped at the very start only
    this.type = "";
    this.data = [];
    this.lastEventId = "";
    this.retryMs = null; // the stream's `retry:` advice, if any
  }

  push(text) {
    const events = [];
    let i = 0;
    if (!this.started && text.length) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) i = 1;
    }
    if (this.afterCr && i < text.length) {
      this.afterCr = false;
      if (text[i] === "\n") i++; // the LF of a CRLF cut between two reads
    }
    const eol = /[\r\n]/g;
    while (i < text.length) {
      eol.lastIndex = i;
      const found = eol.exec(text);
      if (!found) {
        this.line += text.slice(i);
        break;
      }
      const line = this.line + text.slice(i, found.index);
      this.line = "";
      i = found.index + 1;
      if (found[0] === "\r") {
        if (i === text.length) this.afterCr = true;
        else if (text[i] === "\n") i++;
      }
      const event = this.onLine(line);
      if (event) events.push(event);
    }
    return events;
  }

  end() {
    this.line = "";
    this.afterCr = false;
    this.type = "";
    this.data = [];
    return [];
  }

  onLine(line) {
    if (line === "") {
      if (!this.data.length) {
        this.type = "";
        return null;
      }
      const event = { event: this.type || "message", data: this.data.join("\n"), id: this.lastEventId };
      this.type = "";
      this.data = [];
      return event;
    }
    if (line[0] === ":") return null; // a comment
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^[0-9]+$/.test(value)) this.retryMs = Number(value);
    return null;
  }
}

// --- one reply -------------------------------------------------------------------------------

// One reply from `speak()` to its end: its utterance id, its state and figures (`stats`), its
// player, the gateway's events applied to it (`receive`), and barge-in (`stop`, `cancel`).
// What it emits goes out as the speaker's events while it is the speaker's current reply, so
// a reply that was stopped and replaced cannot speak over its successor.
export class Reply {
  constructor(speaker, transport, format) {
    this.speaker = speaker;
    this.transport = transport;
    this.id = null; // the utterance id: the gateway's (SSE) or the speaker's own (WebSocket)
    this.stats = {
      state: "idle", format, transport: speaker.transport, t0: performance.now(),
      firstTextMs: null, firstAudioBytesMs: null, ttfaMs: null, bytes: 0, chunks: 0,
      audioSeconds: 0, maxRms: 0, playingEvent: false, bufferedEnd: 0, player: null,
      serverMetrics: null, serverChunks: null, cancelled: false, error: null, playedMs: 0,
      heardText: null,
    };
    this.player = null;
    this.words = [];
    this.word = -1; // the index of the word being heard
    this.stopped = false;
    this.ended = false;
    this.cancelling = null; // a barge-in's question to the gateway, until it is answered
    this.done = new Promise((resolve) => { this.resolveDone = resolve; });
    this.whenHeard = new Promise((resolve) => { this.resolveHeard = resolve; });
  }

  get state() {
    return this.stats.state;
  }

  emit(type, detail) {
    if (this.speaker.current === this) this.speaker.emit(type, detail);
  }

  setState(state) {
    this.stats.state = state;
    this.emit("state", { state });
  }

  finish() {
    this.ended = true;
    this.resolveDone();
  }

  // the first sample reached the listener
  firstSampleHeard() {
    if (this.stats.ttfaMs !== null) return;
    this.stats.ttfaMs = Math.round(performance.now() - this.stats.t0);
    this.setState("playing");
    this.emit("heard", { ttfaMs: this.stats.ttfaMs });
  }

  // One event of the gateway (SSE event or WebSocket frame), by name, with its JSON body.
  receive(name, body) {
    const stats = this.stats;
    const now = Math.round(performance.now() - stats.t0);
    switch (name) {
      case "agent_start":
        if (body.utterance_id) this.id = body.utterance_id;
        break;
      case "text_delta":
        if (stats.firstTextMs === null) stats.firstTextMs = now;
        this.emit("text", { ...body, t: now });
        break;
      case "audio_chunk": {
        if (this.stopped || !this.player) return; // late audio of a cancelled utterance
        const bytes = body.bytes || b64ToBytes(body.data);
        if (stats.firstAudioBytesMs === null) stats.firstAudioBytesMs = now;
        stats.bytes += bytes.length;
        stats.chunks += 1;
        this.player.push(bytes);
        this.emit("audio", { seq: stats.chunks - 1, bytes: bytes.length, t: now });
        break;
      }
      case "words":
        this.words.push(...body.words);
        this.emit("words", { words: body.words, first: this.words.length - body.words.length });
        break;
      case "audio_stream_end":
        stats.audioSeconds = body.duration_s;
        stats.serverChunks = body.total_chunks; // what the gateway sent, against `chunks`
        break;
      case "error":
        // the server has ended this reply itself: nothing to cancel
        this.fail(`${body.code}: ${body.message}`, {
          code: body.code, retryable: body.retryable, retryAfterS: body.retry_after_s ?? null,
          ended: true,
        });
        break;
      case "cancelled":
        stats.cancelled = true;
        if (body.heard_text !== undefined) this.heard(body.played_ms, body.heard_text);
        break;
      case "agent_end":
        stats.serverMetrics = body.metrics;
        this.emit("metrics", body.metrics);
        this.finish();
        break;
    }
  }

  // `error` events carry {message, code, retryable, retryAfterS}; a refusal up front because
  // the service is at capacity (code "overloaded", HTTP 503 with Retry-After) says when to
  // retry. `ended`: the gateway has ended the reply itself, so there is nothing to abort.
  fail(message, { code = null, retryable = false, retryAfterS = null, ended = false } = {}) {
    if (this.stats.error) return; // the first failure is the one to report
    if (this.stopped) return; // the listener stopped it: what fails after that is not theirs
    this.stats.error = message;
    this.stats.errorCode = code;
    this.setState(code === "overloaded" ? "overloaded" : "error");
    this.emit("error", { message, code, retryable, retryAfterS });
    if (!ended) this.transport.abort(this);
    this.finish();
  }

  heard(playedMs, heardText) {
    if (this.stats.heardText !== null) return;
    this.stats.heardText = heardText;
    this.emit("cancelled", { playedMs, heardText });
    this.resolveHeard(heardText);
  }

  // Ask the gateway to stop the reply, saying how much was heard; `cancelling` settles once it
  // has answered (or given up). A transport with nothing to ask (the reply never started)
  // answers null; one that got no answer resolves undefined, and no `cancelled` event follows.
  cancel(playedMs) {
    const asked = this.transport.cancel(this, playedMs);
    if (!asked) return;
    this.cancelling = asked.then((heardText) => {
      if (heardText !== undefined) this.heard(playedMs, heardText);
    });
  }

  // Barge-in: silence at once, and tell the server how much was heard (`played_ms`, from the
  // audio clock); resolves to what the listener heard of it (`heard_text`), or null.
  async stop() {
    const playedMs = Math.round(this.player ? this.player.playedMs() : 0);
    this.stats.playedMs = playedMs;
    this.stopped = true;
    if (this.player) this.player.stop(); // silence at once (short fade)
    this.cancel(playedMs);
    this.setState("stopped");
    this.finish();
    if (this.cancelling) await this.cancelling;
    return this.stats.heardText;
  }

  // The playback clock: "progress" {playedMs} as the listener hears it, and "word" {index,
  // word, start_ms, end_ms, playedMs} when the word being heard changes (from the audio clock,
  // not from when the timings arrived).
  tick() {
    if (!this.player) return;
    const played = this.player.playedMs();
    if (played === this.stats.playedMs) return;
    this.stats.playedMs = played;
    this.emit("progress", { playedMs: played });
    let index = this.word;
    while (index + 1 < this.words.length && this.words[index + 1].start_ms <= played) index++;
    if (index !== this.word) {
      this.word = index;
      this.emit("word", { index, ...this.words[index], playedMs: played });
    }
  }
}

// --- transports ------------------------------------------------------------------------------
//
// Three transports behind one interface; the speaker holds one, chosen by its `transport`:
//
//   start(reply, query)      send the request; the gateway's events go to reply.receive(name,
//                            body), a failure to reply.fail(message, {code, retryable, ...})
//   cancel(reply, playedMs)  barge-in: ask the gateway to stop it, saying how much was heard;
//                            a promise of its heard_text (null: no answer to read; undefined:
//                            none came), or null when there was nothing to ask
//   abort(reply)             drop the reply without asking what was heard (after an error)
//   release(reply)           the reply is over: let go of what the transport held for it
//   close()                  the speaker is closing

// What both SSE transports share: events by name into the reply, and barge-in over HTTP
// (EventSource cannot send anything back; `POST /v1/speak/{id}/cancel`).
class SseTransport {
  constructor(speaker) {
    this.speaker = speaker;
    this.streams = new Map(); // reply -> how to stop reading its stream
  }

  deliver(reply, event, data) {
    if (EVENT_NAMES.includes(event)) reply.receive(event, JSON.parse(data));
  }

  cancel(reply, playedMs) {
    if (reply.id === null) { // the gateway has not named it yet: only stop reading
      this.abort(reply);
      return null;
    }
    return this.cancelHttp(reply, playedMs).finally(() => this.abort(reply));
  }

  async cancelHttp(reply, playedMs) {
    const url = new URL(`/v1/speak/${encodeURIComponent(reply.id)}/cancel`, this.speaker.baseUrl);
    const headers = { "Content-Type": "application/json" };
    const token = await this.speaker.credential();
    if (token) headers.Authorization = `Bearer ${token}`;
    try {
      const r = await fetch(url, { method: "POST", headers, body: JSON.stringify({ played_ms: playedMs }) });
      const body = r.ok ? await r.json() : null;
      return body ? body.heard_text : null;
    } catch {
      return null;
    }
  }

  abort(reply) {
    const stop = this.streams.get(reply);
    this.streams.delete(reply);
    if (stop) stop();
  }

  release(reply) {
    this.abort(reply); // a stream that ended by itself is closed already; this only forgets it
  }

  close() {
    for (const reply of [...this.streams.keys()]) this.abort(reply);
  }
}

// `GET /v1/speak/sse` through the browser's EventSource (which decodes the stream itself).
export class EventSourceTransport extends SseTransport {
  async start(reply, query) {
    const url = new URL("/v1/speak/sse", this.speaker.baseUrl);
    const params = { ...query, token: await this.speaker.credential() };
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
    const es = new EventSource(url);
    this.streams.set(reply, () => es.close());
    for (const name of EVENT_NAMES) {
      es.addEventListener(name, (e) => {
        if (name === "error" && !e.data) return; // a transport error, handled below
        if (name === "agent_end") this.abort(reply); // before EventSource can reconnect and replay
        this.deliver(reply, name, e.data);
      });
    }
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED && reply.stats.serverMetrics === null && !reply.stopped) {
        // EventSource cannot read a refusal's status or body: fetch SSE and the WebSocket can
        const early = reply.id === null;
        reply.fail(early ? "event stream refused (the service may be at capacity; retry shortly)"
          : "event stream failed", { retryable: early });
      }
    };
  }
}

// `POST /v1/speak` through fetch, its body read as it arrives and decoded by `SseDecoder`
// (POST, an Authorization header, and a refusal's status, body and Retry-After can be read).
export class SseFetchTransport extends SseTransport {
  async start(reply, query) {
    const token = await this.speaker.credential();
    const controller = new AbortController();
    this.streams.set(reply, () => controller.abort());
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const request = { method: "POST", headers, body: JSON.stringify(query), signal: controller.signal };
    this.read(reply, request, controller.signal).catch((err) => {
      if (!reply.stopped) reply.fail(err.message || String(err));
    });
  }

  async read(reply, request, signal) {
    const response = await fetch(new URL("/v1/speak", this.speaker.baseUrl), request);
    if (!response.ok) {
      const err = await response.json().catch(() => ({ error: { message: response.statusText } }));
      const retryAfter = Number(response.headers.get("Retry-After"));
      if (!reply.stopped) {
        reply.fail(`${err.error.code || response.status}: ${err.error.message}`, {
          code: err.error.code || null,
          retryable: Boolean(err.error.retryable),
          retryAfterS: Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : null,
        });
      }
      return;
    }
    const reader = response.body.getReader();
    const text = new TextDecoder();
    const sse = new SseDecoder();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        const events = done ? [...sse.push(text.decode()), ...sse.end()]
          : sse.push(text.decode(value, { stream: true }));
        for (const { event, data } of events) this.deliver(reply, event, data);
        if (done) break;
      }
    } finally {
      if (!signal.aborted) reader.releaseLock();
    }
    if (!reply.ended && !reply.stopped) reply.fail("event stream ended before the reply did");
  }
}

// `/v1/speak/ws`: one connection for all the speaker's replies, kept open between them and
// opened again by itself when it breaks. Frames are routed by utterance id, so late frames of
// a stopped reply go to that reply (which drops its audio), never to the next one. With
// `protocol` 2 (`ContextTransport`) each reply is a context of its own, named in every message
// and frame, so the next reply opens without waiting for the last one's end.
export class WebSocketTransport {
  constructor(speaker, protocol = 1) {
    this.speaker = speaker;
    this.protocol = protocol;
    this.key = protocol === 2 ? "context_id" : "utterance_id"; // what names a reply
    this.ws = null;
    this.replies = new Map(); // utterance id -> {reply, ws}: the replies on a connection
    this.latest = null; // the newest reply: frames without an utterance id are about it
    this.reconnecting = false;
  }

  async start(reply, query) {
    const ws = await this.open();
    if (reply.ended) return; // stopped while the connection opened
    reply.id = `u${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;
    this.replies.set(reply.id, { reply, ws });
    this.latest = reply;
    ws.send(JSON.stringify({ type: "speak", ...query, [this.key]: reply.id }));
  }

  send(reply, message) {
    const entry = this.replies.get(reply.id);
    if (!entry || entry.reply !== reply || entry.ws.readyState !== WebSocket.OPEN) return false;
    entry.ws.send(JSON.stringify(this.protocol === 2 ? { ...message, context_id: reply.id } : message));
    return true;
  }

  cancel(reply, playedMs) {
    if (!this.send(reply, { type: "cancel", played_ms: playedMs })) return null;
    let timer;
    const silence = new Promise((resolve) => { timer = setTimeout(resolve, 5000); }); // a server that never answers
    return Promise.race([reply.whenHeard, silence]).finally(() => clearTimeout(timer));
  }

  abort(reply) {
    this.send(reply, { type: "cancel" });
  }

  release(reply) {
    const entry = this.replies.get(reply.id);
    if (entry && entry.reply === reply) this.replies.delete(reply.id);
    if (this.latest === reply) this.latest = null;
  }

  close() {
    if (this.ws) this.ws.close(1000);
  }

  async open() {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) return this.ws;
    const url = new URL("/v1/speak/ws", this.speaker.baseUrl);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (this.protocol === 2) url.searchParams.set("protocol", "2");
    const token = await this.speaker.credential();
    if (token) url.searchParams.set("token", token);
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error("WebSocket connection failed"));
    });
    ws.onmessage = (e) => this.onMessage(e);
    ws.onclose = (e) => this.onClose(ws, e);
    this.ws = ws;
    return ws;
  }

  onMessage(e) {
    if (typeof e.data === "string") {
      const body = JSON.parse(e.data);
      const id = body[this.key];
      const reply = id ? this.replies.get(id)?.reply : this.latest;
      if (!reply) return;
      if (body.type === "error" && !id && reply.stats.serverMetrics) return;
      reply.receive(body.type, body);
      return;
    }
    const bytes = new Uint8Array(e.data);
    const n = bytes[0];
    const owner = this.replies.get(new TextDecoder().decode(bytes.subarray(1, 1 + n)));
    if (!owner || owner.reply.stopped) return; // stale audio: drop it
    owner.reply.receive("audio_chunk", { bytes: bytes.subarray(1 + n) });
  }

  onClose(ws, e) {
    for (const { reply, ws: on } of this.replies.values()) {
      if (on === ws && reply.stats.serverMetrics === null && !reply.stopped) {
        // 1012: the gateway restarts (it lets replies finish first); 1006: the connection broke
        reply.fail("WebSocket closed", { retryable: e.code !== 1000 && e.code !== 1008, ended: true });
      }
    }
    if (this.ws === ws) this.ws = null;
    if (e.code !== 1000 && !this.speaker.closed) this.reconnect(e.code);
  }

  // The gateway went away (a restart closes with 1012, a crash with 1006): connect again with
  // growing, jittered waits, saying so through "reconnecting" and "reconnected" events.
  async reconnect(code) {
    if (this.reconnecting) return;
    this.reconnecting = true;
    try {
      for (let attempt = 1; !this.speaker.closed; attempt++) {
        const delayMs = Math.round(Math.random() * Math.min(5000, 250 * 2 ** (attempt - 1)));
        this.speaker.emit("reconnecting", { attempt, delayMs, code });
        await new Promise((resolve) => setTimeout(resolve, delayMs));
        if (this.speaker.closed || (this.ws && this.ws.readyState === WebSocket.OPEN)) return;
        try {
          await this.open();
          this.speaker.emit("reconnected", { attempts: attempt });
          return;
        } catch { /* not back yet */ }
      }
    } finally {
      this.reconnecting = false;
    }
  }
}

// protocol 2: each reply a context of its own on the one socket
export class ContextTransport extends WebSocketTransport {
  constructor(speaker) {
    super(speaker, 2);
  }
}

export const TRANSPORTS = {
  sse: EventSourceTransport, "sse-fetch": SseFetchTransport, ws: WebSocketTransport, ws2: ContextTransport,
};

// --- the speaker -----------------------------------------------------------------------------

// The player for a format: pcm through the worklet; mp3, aac and opus through MSE, or mp3
// through WebCodecs where MSE lacks it (or `decoder: "webcodecs"` asks). Throws for a format
// nothing here can play (wav, the telephone's ulaw_8000 and alaw_8000, a sample rate other than
// the model's, or a type this browser's MSE refuses).
async function makePlayer(format, sampleRate, { decoder, workletUrl }, stats, heard) {
  if (sampleRate && Number(sampleRate) !== SAMPLE_RATE) {
    throw new Error(`sample_rate ${sampleRate} cannot play here: the player runs at ${SAMPLE_RATE}`);
  }
  const webcodecs = format === "mp3" && (decoder === "webcodecs" || !MediaSource.isTypeSupported(MSE_TYPES.mp3));
  if (format === "pcm" || webcodecs) {
    const worklet = new WorkletPlayer(await audioContext(workletUrl), stats, heard);
    return webcodecs ? new WebCodecsMp3Player(worklet) : worklet;
  }
  const type = MSE_TYPES[format];
  if (!type || !MediaSource.isTypeSupported(type)) throw new Error(`format ${format} cannot play here`);
  return new MsePlayer(type, stats, heard);
}

export class Speaker extends EventTarget {
  constructor({ baseUrl = "", transport = "sse", decoder = "auto", workletUrl, token = null } = {}) {
    super();
    const Transport = TRANSPORTS[transport];
    if (!Transport) throw new Error(`unknown transport ${transport}: one of ${Object.keys(TRANSPORTS).join(", ")}`);
    this.baseUrl = baseUrl || location.origin;
    this.token = token; // a string, or an async function returning one
    this.transport = transport; // its name; the transport itself is `link`
    this.decoder = decoder; // "auto" | "webcodecs" (force the MSE fallback path)
    this.workletUrl = workletUrl || new URL("./pcm-worklet.js", import.meta.url);
    this.link = new Transport(this);
    this.current = null; // the Reply in progress
    this.lastPlayer = null; // the last reply's output, released when the next one starts
    this.closed = false;
  }

  async credential() {
    return typeof this.token === "function" ? await this.token() : this.token;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  // Resolves to the reply's stats once it has played out, been stopped or failed; a failure
  // (a refusal, a broken stream, a format this browser cannot play) is an `error` event and
  // `stats.error`, and leaves the speaker ready for the next reply.
  async speak(params) {
    if (this.current) this.stop();
    if (this.lastPlayer) this.lastPlayer.release(); // the previous reply's output, now silent
    this.lastPlayer = null;
    const format = params.format || "mp3";
    const reply = new Reply(this, this.link, format);
    this.current = reply;
    const query = { mode: "bidi", ...params, format };
    let clock = null;
    try {
      const player = await makePlayer(format, params.sample_rate, this, reply.stats, () => reply.firstSampleHeard());
      if (this.current !== reply) { // stopped and replaced while the player was made
        player.release();
      } else {
        reply.player = this.lastPlayer = player;
        reply.stats.player = player.constructor.name;
        reply.emit("player", { player: reply.stats.player });
        clock = setInterval(() => reply.tick(), 25);
      }
      if (!reply.ended) await this.link.start(reply, query);
    } catch (err) {
      reply.fail(err.message || String(err));
    }
    await reply.done;
    if (!reply.stopped && !reply.stats.error) {
      await reply.player.end();
      if (!reply.stopped) reply.setState("done");
    }
    clearInterval(clock);
    reply.tick();
    if (reply.cancelling) await reply.cancelling; // what was heard, from the server
    this.link.release(reply);
    if (this.current === reply) this.current = null;
    return reply.stats;
  }

  // Barge-in: silence at once, and tell the server how much was heard (`played_ms`, from the
  // audio clock); resolves to what the listener heard of it (`heard_text`), or null.
  async stop() {
    return this.current ? this.current.stop() : null;
  }

  close() {
    this.closed = true; // no more reconnects
    if (this.current) this.stop();
    if (this.lastPlayer) this.lastPlayer.release();
    this.lastPlayer = null;
    this.link.close();
  }
}
