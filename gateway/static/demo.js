import { Speaker } from "/static/speak.js";

const $ = (id) => document.getElementById(id);
const metrics = $("metrics");
const demo = {
  speaker: null, stats: null, timeline: { text: [], audio: [], heard: null }, connection: [],
  wordLog: [], heardText: undefined,
  states: [], // the states the page went through since the last speak, in order
};
window.demo = demo; // for automation
// a gateway with API keys: open the page as /?token=... (a token from POST /v1/tokens)
const pageToken = new URLSearchParams(location.search).get("token");

async function loadVoices() {
  try {
    const r = await fetch("/v1/voices", pageToken ? { headers: { Authorization: `Bearer ${pageToken}` } } : {});
    if (!r.ok) return;
    const body = await r.json();
    for (const v of body.voices) {
      const opt = new Option(v.name, v.name);
      $("voice").append(opt);
    }
  } catch { /* the default voice still works */ }
}

function setState(state) {
  demo.states.push(state);
  metrics.dataset.state = state;
  $("m-state").textContent = state;
  const busy = state === "playing" || state === "waiting";
  $("stop").disabled = !busy;
}

function renderTimeline() {
  const t = demo.timeline;
  const last = Math.max(4000, ...t.text, ...t.audio, t.heard || 0);
  const scale = (ms) => `${(100 * ms) / (last * 1.05)}%`;
  const lane = (el, times) => {
    el.replaceChildren(...times.map((ms) => {
      const tick = document.createElement("div");
      tick.className = "tick";
      tick.style.left = scale(ms);
      return tick;
    }));
  };
  lane($("lane-text"), t.text);
  lane($("lane-audio"), t.audio);
  if (t.heard !== null) {
    const mark = document.createElement("div");
    mark.className = "heard";
    mark.style.left = scale(t.heard);
    mark.title = `first audio heard at ${t.heard} ms`;
    $("lane-audio").append(mark);
  }
}

function reset() {
  demo.timeline = { text: [], audio: [], heard: null };
  demo.states = [];
  delete metrics.dataset.ttfaMs;
  for (const id of ["m-text", "m-ttfa"]) $(id).textContent = "–";
  $("m-bytes").textContent = "0";
  $("m-seconds").textContent = "0";
  $("sentences").replaceChildren();
  $("captions").replaceChildren();
  demo.wordLog = [];
  demo.heardText = undefined;
  $("heard").textContent = "";
  $("error").textContent = "";
  renderTimeline();
}

function newSpeaker(transport) {
  if (demo.speaker && demo.speaker.transport === transport) return demo.speaker;
  if (demo.speaker) demo.speaker.close();
  const decoder = new URLSearchParams(location.search).get("decoder") || "auto";
  const speaker = new Speaker({ transport, decoder, token: pageToken });
  speaker.addEventListener("state", (e) => setState(e.detail.state));
  speaker.addEventListener("text", (e) => {
    demo.timeline.text.push(e.detail.t);
    if ($("m-text").textContent === "–") $("m-text").textContent = `${e.detail.t} ms`;
    renderTimeline();
  });
  speaker.addEventListener("audio", (e) => {
    demo.timeline.audio.push(e.detail.t);
    $("m-bytes").textContent = String(speaker.current ? speaker.current.stats.bytes : 0);
    renderTimeline();
  });
  speaker.addEventListener("heard", (e) => {
    metrics.dataset.ttfaMs = String(e.detail.ttfaMs);
    $("m-ttfa").textContent = `${e.detail.ttfaMs} ms`;
    demo.timeline.heard = e.detail.ttfaMs;
    renderTimeline();
  });
  speaker.addEventListener("metrics", (e) => {
    const m = e.detail;
    $("m-seconds").textContent = String(m.duration_s);
    $("sentences").replaceChildren(...m.chunk_times_ms.map((ms, i) => {
      const li = document.createElement("li");
      li.textContent = `chunk ${i + 1} sent to synthesis at ${ms} ms`;
      return li;
    }));
  });
  // live figures and captions, in step with what the listener hears
  speaker.addEventListener("player", (e) => { $("m-player").textContent = e.detail.player; });
  speaker.addEventListener("progress", (e) => {
    $("m-seconds").textContent = (e.detail.playedMs / 1000).toFixed(1);
  });
  speaker.addEventListener("words", (e) => {
    $("captions").append(...e.detail.words.map((w, i) => {
      const span = document.createElement("span");
      span.textContent = `${w.word} `;
      span.dataset.index = String(e.detail.first + i);
      span.dataset.startMs = String(w.start_ms);
      span.dataset.endMs = String(w.end_ms);
      return span;
    }));
  });
  speaker.addEventListener("word", (e) => {
    for (const span of $("captions").children) {
      const index = Number(span.dataset.index);
      span.classList.toggle("spoken", index <= e.detail.index);
      span.classList.toggle("now", index === e.detail.index);
    }
    demo.wordLog.push(e.detail);
  });
  speaker.addEventListener("cancelled", (e) => {
    const { heardText } = e.detail;
    demo.heardText = heardText;
    $("heard").textContent = heardText === null ? "" : heardText
      ? `Heard before Stop: “${heardText}”` : "Stopped before a whole word was heard.";
  });
  speaker.addEventListener("reconnecting", (e) => {
    demo.connection.push({ event: "reconnecting", ...e.detail });
    $("connection").textContent = `Reconnecting to the voice service (attempt ${e.detail.attempt})…`;
  });
  speaker.addEventListener("reconnected", (e) => {
    demo.connection.push({ event: "reconnected", ...e.detail });
    $("connection").textContent = "Reconnected.";
  });
  speaker.addEventListener("error", (e) => {
    const { message, code, retryAfterS } = e.detail;
    $("error").textContent = code === "overloaded"
      ? `The voice service is busy right now${retryAfterS ? `: try again in ${retryAfterS} s` : ""}. (${message})`
      : message;
    $("error").dataset.code = code || "";
  });
  demo.speaker = speaker;
  return speaker;
}

// A sentence in each language, offered when the language is picked over the text shown before
const SAMPLES = {
  "en-us": "Your order shipped yesterday from our warehouse in Portland. It should arrive by Thursday.",
  "en-gb": "Your parcel left our Manchester warehouse yesterday. It should arrive by Thursday.",
  ja: "ご注文の品は昨日、倉庫から発送されました。木曜日の午後に届く予定です。",
  zh: "您的订单昨天已经发货了。预计星期四下午送到。",
  es: "Su pedido salió ayer de nuestro almacén. Debería llegar el jueves por la tarde.",
  fr: "Votre commande est partie hier de notre entrepôt. Elle devrait arriver jeudi après-midi.",
  hi: "आपका ऑर्डर कल हमारे गोदाम से भेजा गया। यह गुरुवार दोपहर तक पहुँच जाना चाहिए।",
  it: "Il suo ordine è partito ieri dal nostro magazzino. Dovrebbe arrivare giovedì pomeriggio.",
  "pt-br": "Seu pedido saiu ontem do nosso armazém. Deve chegar na quinta-feira à tarde.",
};
// Markup (docs/protocols.md#markup): a pause, a word said as written in IPA, and SSML
const EXAMPLES = {
  pause: "Let me check that for you. [pause:1s] Your order shipped this morning.",
  ipa: "Your assistant today is [Kokoro](/kˈOkəɹO/), and it reads names the way you write them.",
  ssml: '<speak>Your order code is <say-as interpret-as="characters">KX</say-as>' +
    '<break time="600ms"/> <prosody rate="slow">four eight two one.</prosody></speak>',
};
let offered = $("text").value; // the text the page last put there
function offer(sample) {
  if (sample && $("text").value === offered) $("text").value = offered = sample; // never over the listener's own
}
$("language").addEventListener("change", () => offer(SAMPLES[$("language").value]));
$("example").addEventListener("change", () => offer(EXAMPLES[$("example").value]));

$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  reset();
  const speaker = newSpeaker($("transport").value);
  const input = $("input").value;
  const params = {
    mode: $("mode").value,
    format: $("format").value,
    voice: $("voice").value || undefined,
    language: $("language").value || undefined,
    timestamps: true, // captions
  };
  params[input] = $("text").value;
  if (input === "text" && Number($("tps").value) > 0) {
    params.echo_tps = Number($("tps").value);
    params.echo_first_ms = 300;
  }
  setState("waiting");
  let stats = await speaker.speak(params);
  // a gateway that does not pace the echo source (beyond loopback, no --echo-pacing) says
  // echo_pacing_disabled; EventSource cannot read why it was refused: asked again unpaced.
  // (A fetch or WebSocket reply that failed otherwise is not asked again.)
  const unread =
    speaker.transport === "sse" && stats.error && stats.errorCode === null && !stats.bytes;
  if (params.echo_tps !== undefined && (stats.errorCode === "echo_pacing_disabled" || unread)) {
    demo.stats = stats; // what the refused ask gave, until the next one ends
    if (stats.errorCode === "echo_pacing_disabled") $("tps").value = "0";
    delete params.echo_tps;
    delete params.echo_first_ms;
    stats = await speaker.speak(params);
  }
  demo.stats = stats;
  $("m-player").textContent = stats.player;
  $("m-bytes").textContent = String(stats.bytes);
  if (stats.error) setState(stats.errorCode === "overloaded" ? "overloaded" : "error");
});

$("stop").addEventListener("click", () => demo.speaker && demo.speaker.stop());

loadVoices();
setState("idle");
