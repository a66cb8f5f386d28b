// The page's reader of the configs users run (tools/user_files.py's read_accelerate, read_deepspeed and read_trainer,
// ported): an accelerate config YAML, a DeepSpeed JSON or the Trainer's arguments (axolotl, LLaMA-Factory, TRL) pasted
// in, the setup it says out, in the vocabulary's keys (engine, state_dict, adapter, loop and the settings that are
// fixes: use_reentrant, zero3_gather_16bit, average_tokens, accumulation), and the GPUs (num_processes). YAML is read
// as PyYAML's safe_load reads the block style these tools write; what this reader cannot read for sure (anchors,
// tags, block scalars, nested flow collections, a file a config names) is "not read", never guessed.
(function (root) {
  "use strict";
  class NotRead extends Error {}
  const DISTRIBUTED_TYPES = ["NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
    "MULTI_MUSA", "MULTI_HPU", "FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM", "TP"];
  const STATE_DICT_TYPES = { FULL_STATE_DICT: "full_state_dict", SHARDED_STATE_DICT: "sharded_state_dict", LOCAL_STATE_DICT: null };

  // --- YAML, the block style (PyYAML's YAML 1.1 scalars) ---------------------------------------------------------
  const NULLS = new Set(["", "~", "null", "Null", "NULL"]);
  const TRUES = new Set(["yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"]);
  const FALSES = new Set(["no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"]);
  function scalar(raw, where) {
    const text = raw.trim();
    if (/^[&*!|>%@`]/.test(text)) throw new NotRead(`${where}: ${text.slice(0, 20)}: YAML this page does not read (paste it to the command line tool)`);
    if (text.startsWith('"')) {
      try { return JSON.parse(text); } catch (e) { throw new NotRead(`${where}: a quoted value that does not end`); }
    }
    if (text.startsWith("'")) {
      if (!/^'(?:[^']|'')*'$/.test(text)) throw new NotRead(`${where}: a quoted value that does not end`);
      return text.slice(1, -1).replace(/''/g, "'");
    }
    if (text.startsWith("[") || text.startsWith("{")) return flow(text, where);
    if (NULLS.has(text)) return null;
    if (TRUES.has(text)) return true;
    if (FALSES.has(text)) return false;
    if (/^[-+]?(0|[1-9][0-9_]*)$/.test(text)) return Number(text.replace(/_/g, ""));
    if (/^[-+]?([0-9][0-9_]*)?\.[0-9.]*([eE][-+][0-9]+)?$/.test(text) && /[0-9]/.test(text)) return Number(text.replace(/_/g, ""));
    return text;
  }
  function flow(text, where) {
    const close = text[0] === "[" ? "]" : "}";
    if (!text.endsWith(close)) throw new NotRead(`${where}: a flow collection that does not end`);
    const inner = text.slice(1, -1).trim();
    if (/[[\]{}]/.test(inner)) throw new NotRead(`${where}: a nested flow collection this page does not read`);
    const parts = inner ? inner.split(",").map((p) => p.trim()) : [];
    if (close === "]") return parts.map((p) => scalar(p, where));
    const out = {};
    for (const p of parts) {
      const at = p.indexOf(":");
      if (at < 0) throw new NotRead(`${where}: a flow mapping without 'key: value'`);
      out[String(scalar(p.slice(0, at), where))] = scalar(p.slice(at + 1), where);
    }
    return out;
  }
  function withoutComment(line) {
    let quote = null;
    for (let i = 0; i < line.length; i++) {
      const c = line[i];
      if (quote) { if (c === quote) quote = null; continue; }
      if (c === '"' || c === "'") { if (i === 0 || /[\s:\-[{,]/.test(line[i - 1])) quote = c; continue; }
      if (c === "#" && (i === 0 || /\s/.test(line[i - 1]))) return line.slice(0, i);
    }
    return line;
  }
  function lines(text) {
    const out = [];
    text.split(/\r\n|\r|\n/).forEach((raw, n) => {
      const line = withoutComment(raw).replace(/\s+$/, "");
      if (/^(---|\.\.\.)$/.test(line.trim()) && out.length) throw new NotRead(`line ${n + 1}: more than one YAML document`);
      if (!line.trim() || /^(---|\.\.\.)$/.test(line.trim())) return;
      const indent = line.length - line.replace(/^ +/, "").length;
      if (line[indent] === "\t") throw new NotRead(`line ${n + 1}: a tab in the indentation`);
      out.push({ indent, text: line.slice(indent), n: n + 1 });
    });
    return out;
  }
  function keyValue(item) {
    const m = /^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^:#]+?)\s*:(?:\s+(.*))?$/.exec(item.text);
    if (!m) throw new NotRead(`line ${item.n}: neither 'key: value' nor a list item`);
    return [String(scalar(m[1], `line ${item.n}`)), m[2] === undefined ? "" : m[2]];
  }
  function block(items, at, indent) {
    const first = items[at];
    if (first.text === "-" || first.text.startsWith("- ")) {
      const list = [];
      while (at < items.length && items[at].indent === indent && (items[at].text === "-" || items[at].text.startsWith("- "))) {
        const item = items[at];
        const rest = item.text.slice(1).trim();
        if (/^[^'"[{][^:]*:(\s|$)/.test(rest)) {  // "- key: value" and the keys below it: a mapping in the list
          const column = item.indent + item.text.length - item.text.slice(1).replace(/^ +/, "").length;
          items[at] = { indent: column, text: rest, n: item.n };
          const [map, next] = block(items, at, column);
          list.push(map);
          at = next;
          continue;
        }
        list.push(rest === "" ? null : scalar(rest, `line ${item.n}`));
        at += 1;
      }
      return [list, at];
    }
    const map = {};
    while (at < items.length && items[at].indent === indent) {
      const item = items[at];
      if (item.text.startsWith("- ")) throw new NotRead(`line ${item.n}: a list item where a key was expected`);
      const [key, value] = keyValue(item);
      at += 1;
      if (value.trim() !== "") map[key] = scalar(value, `line ${item.n}`);
      else if (at < items.length && (items[at].indent > indent || (items[at].indent === indent && items[at].text.startsWith("- ")))) {
        [map[key], at] = block(items, at, items[at].indent);
      } else map[key] = null;
    }
    if (at < items.length && items[at].indent > indent) throw new NotRead(`line ${items[at].n}: indented deeper than the key above it`);
    return [map, at];
  }
  function parseYaml(text) {
    const items = lines(text);
    if (!items.length) return null;
    if (items.length === 1 && !/:(\s|$)/.test(items[0].text) && !items[0].text.startsWith("- ")) return scalar(items[0].text, "line 1");
    const [value, at] = block(items, 0, items[0].indent);
    if (at < items.length) throw new NotRead(`line ${items[at].n}: indented less than the first key`);
    return value;
  }

  // --- the configs ---------------------------------------------------------------------------------------------
  function load(text, kinds, json) {
    const body = String(text).replace(/^\uFEFF/, "");
    let data;
    try { data = json ? JSON.parse(body) : parseYaml(body); } catch (exc) {
      if (exc instanceof NotRead) throw exc;
      throw new NotRead(`not ${kinds}: ${exc.message}`);
    }
    if (data === null || data === undefined) throw new NotRead("read as nothing: an empty config");
    // nested at most 64 deep (user_text.MOST_DEPTH)
    const todo = [[data, 0]];
    while (todo.length) {
      const [value, depth] = todo.pop();
      if (value === null || typeof value !== "object") continue;
      if (depth >= 64) throw new NotRead(`not ${kinds}: nested deeper than 64 levels`);
      for (const v of Object.values(value)) todo.push([v, depth + 1]);
    }
    if (typeof data !== "object" || Array.isArray(data)) throw new NotRead(`not ${kinds}: its top level is not a mapping`);
    return data;
  }
  const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  // Python's truth of a value (the reader it ports tests `if deepspeed and fsdp`): empty lists and mappings are false.
  const truthy = (v) => !(v === null || v === undefined || v === false || v === 0 || v === "" || (Array.isArray(v) && !v.length) || (isMap(v) && !Object.keys(v).length));
  function mapping(data, key) {
    const v = data[key];
    if (v === null || v === undefined) return {};
    if (!isMap(v)) throw new NotRead(`${key} is ${JSON.stringify(v)}, not a mapping of settings`);
    return v;
  }
  function boolean(key, value) {
    if (value === null || value === undefined || value === "auto") return null;
    if (typeof value === "boolean") return value ? "true" : "false";
    if (typeof value === "object") throw new NotRead(`${key} is ${JSON.stringify(value)}: expected true or false`);
    const said = String(value).trim().toLowerCase();
    if (["true", "yes", "1", "on"].includes(said)) return "true";
    if (["false", "no", "0", "off"].includes(said)) return "false";
    throw new NotRead(`${key} is ${JSON.stringify(value)}: expected true or false`);
  }
  function stage(value) { return typeof value === "string" && /^\d+$/.test(value) ? Number(value) : value; }
  function oneOf(key, value, allowed) {
    if (!allowed.includes(value)) throw new NotRead(`${key} is ${JSON.stringify(value)}: expected one of ${allowed.join(", ")}`);
    return value;
  }
  function count(key, value) {
    if (typeof value === "boolean" || !/^\d+$/.test(String(value)) || Number(value) < 1) throw new NotRead(`${key} is ${JSON.stringify(value)}: expected a whole number of at least 1`);
    return Number(value);
  }
  function stateDict(key, value, setup) {
    if (value === null || value === undefined) return;
    const said = oneOf(key, String(value).toUpperCase(), Object.keys(STATE_DICT_TYPES));
    if (STATE_DICT_TYPES[said]) setup.state_dict = STATE_DICT_TYPES[said];
  }
  function readAccelerate(text) {
    const data = load(text, "an accelerate config YAML");
    const kind = oneOf("distributed_type", String(data.distributed_type === undefined || data.distributed_type === null ? "" : data.distributed_type).toUpperCase(), DISTRIBUTED_TYPES);
    const found = { setup: {}, gpus: null, read: [`distributed_type ${kind}`] };
    if (data.num_processes !== undefined && data.num_processes !== null && kind !== "NO") found.gpus = count("num_processes", data.num_processes);
    const precision = data.mixed_precision;
    if (precision !== undefined && precision !== null && precision !== "no") found.setup.precision = oneOf("mixed_precision", precision, ["bf16", "fp16", "fp8"]);
    if (kind === "FSDP") {
      const fsdp = mapping(data, "fsdp_config");
      found.setup.engine = "fsdp" + oneOf("fsdp_config.fsdp_version", stage(truthy(fsdp.fsdp_version) ? fsdp.fsdp_version : 1), [1, 2]);
      stateDict("fsdp_config.fsdp_state_dict_type", fsdp.fsdp_state_dict_type, found.setup);
    } else if (kind === "DEEPSPEED") {
      const ds = mapping(data, "deepspeed_config");
      if (truthy(ds.deepspeed_config_file)) throw new NotRead(`deepspeed_config.deepspeed_config_file ${ds.deepspeed_config_file}: a file this page cannot open: paste that DeepSpeed JSON instead`);
      if (ds.zero_stage !== undefined && ds.zero_stage !== null) found.setup.engine = "zero" + oneOf("deepspeed_config.zero_stage", stage(ds.zero_stage), [0, 1, 2, 3]);
      const gather = boolean("deepspeed_config.zero3_save_16bit_model", ds.zero3_save_16bit_model);
      if (gather) found.setup.zero3_gather_16bit = gather;
    } else if (["MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"].includes(kind)) found.setup.engine = "ddp";
    else if (kind === "NO") found.setup.engine = "single";
    return found;
  }
  // DeepSpeed's ZeRO field for gathering 16-bit weights on save: its name, its alias, its deprecated name
  // (user_configs.GATHER; DeepSpeed's config models populate a field by name or alias and refuse both at once).
  const GATHER = ["gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"];
  function deepspeedSettings(data, setup) {
    let zero = data.zero_optimization;
    if (typeof zero === "boolean") zero = { stage: zero ? 1 : 0 };  // DeepSpeed's old form
    zero = mapping({ zero_optimization: zero }, "zero_optimization");
    if (zero.stage !== undefined && zero.stage !== null) setup.engine = "zero" + oneOf("zero_optimization.stage", stage(zero.stage), [0, 1, 2, 3]);
    const given = GATHER.filter((k) => k in zero && zero[k] !== "auto");
    if (given.length > 1) throw new NotRead(`zero_optimization sets both ${given[0]} and ${given[1]}: one field under two names, which DeepSpeed refuses`);
    if (!given.length) return [];
    const gather = boolean("zero_optimization." + given[0], zero[given[0]]);
    if (gather) setup.zero3_gather_16bit = gather;
    return given[0] === GATHER[1] ? [] : [`${given[0]}: DeepSpeed's ${given[0] === GATHER[0] ? "name" : "deprecated name"} of ${GATHER[1]}`];
  }
  function readDeepspeed(text) {
    const data = load(text, "a DeepSpeed JSON config", true);
    const found = { setup: {}, gpus: null, read: ["DeepSpeed"] };
    found.read.push(...deepspeedSettings(data, found.setup));
    return found;
  }
  function majorOf(version) { const m = /^\s*v?(\d+)/.exec(String(version || "")); return m ? Number(m[1]) : null; }
  function trainerAdapter(data) {
    let said = truthy(data.adapter) ? data.adapter : truthy(data.finetuning_type) ? data.finetuning_type : null;
    if (said === null && data.use_peft !== undefined && data.use_peft !== null) said = boolean("use_peft", data.use_peft) === "true" ? "lora" : "full";
    if (said === null) return null;
    said = String(said).toLowerCase();
    if (!["lora", "qlora", "full", "freeze"].includes(said)) throw new NotRead(`adapter ${JSON.stringify(said)}: expected lora, qlora or full`);
    if (said === "full" || said === "freeze") return "none";
    const dora = ["peft_use_dora", "use_dora"].some((k) => boolean(k, data[k]) === "true");
    const fourBit = said === "qlora" || boolean("load_in_4bit", data.load_in_4bit) === "true" || String(data.quantization_bit === undefined || data.quantization_bit === null ? "" : data.quantization_bit) === "4";
    return dora ? (fourBit ? "qdora" : "dora") : (fourBit ? "qlora" : "lora");
  }
  // axolotl's config: base_model (axolotl's required key), or its own top-level fsdp_version (user_configs.is_axolotl).
  function isAxolotl(data) { return "base_model" in data || "fsdp_version" in data; }
  const isOff = (v) => v === null || v === undefined || v === false || v === 0 || v === "" || (Array.isArray(v) && !v.length);
  function fsdpConfig(data) {
    const config = truthy(data.fsdp_config) ? data.fsdp_config : {};
    if (typeof config === "string") throw new NotRead(`fsdp_config ${config}: a file this page cannot open: paste its settings instead`);
    if (!isMap(config)) throw new NotRead(`fsdp_config is ${JSON.stringify(config)}, not a mapping of settings`);
    return config;
  }
  function readTrainer(text, pins) {
    const data = load(text, "a Trainer config (YAML or JSON)");
    const axolotl = isAxolotl(data);
    const found = { setup: { loop: "trainer" }, gpus: null, read: [axolotl ? "an axolotl config" : "the Trainer's arguments"] };
    const deepspeed = data.deepspeed, fsdp = data.fsdp;
    if (truthy(deepspeed) && (truthy(fsdp) || (axolotl && truthy(data.fsdp_config)))) throw new NotRead("both deepspeed and fsdp are set: the Trainer runs one of them");
    if (isMap(deepspeed)) found.read.push(...deepspeedSettings(deepspeed, found.setup));
    else if (typeof deepspeed === "string" && deepspeed) throw new NotRead(`deepspeed ${deepspeed}: a file this page cannot open: paste that DeepSpeed JSON instead`);
    else if (!(deepspeed === null || deepspeed === undefined || deepspeed === false || deepspeed === "" || deepspeed === 0)) throw new NotRead(`deepspeed is ${JSON.stringify(deepspeed)}: expected a DeepSpeed JSON's path or its settings`);
    if (axolotl) {
      // axolotl: FSDP where fsdp or fsdp_config is set; the top-level fsdp_version, else fsdp_config's, else FSDP1.
      if (isOff(fsdp) && !truthy(data.fsdp_config)) {
        if (data.fsdp_version !== undefined && data.fsdp_version !== null) found.read.push("fsdp_version without fsdp or fsdp_config: no FSDP");
      } else {
        if (!isOff(fsdp) && !(typeof fsdp === "string" || Array.isArray(fsdp) || typeof fsdp === "boolean")) throw new NotRead(`fsdp is ${JSON.stringify(fsdp)}: expected the Trainer's fsdp options (a string or a list)`);
        const config = fsdpConfig(data);
        let version = truthy(data.fsdp_version) ? data.fsdp_version : truthy(config.fsdp_version) ? config.fsdp_version : truthy(config.version) ? config.version : null;
        const key = truthy(data.fsdp_version) ? "fsdp_version" : "fsdp_config.fsdp_version";
        if (version === null) { version = 1; found.read.push("no fsdp_version: axolotl's FSDP1"); }
        found.setup.engine = "fsdp" + oneOf(key, stage(version), [1, 2]);
        stateDict("fsdp_config.state_dict_type", "state_dict_type" in config ? config.state_dict_type : config.fsdp_state_dict_type, found.setup);
      }
    } else if (!isOff(fsdp)) {
      if (!(typeof fsdp === "string" || Array.isArray(fsdp) || typeof fsdp === "boolean")) throw new NotRead(`fsdp is ${JSON.stringify(fsdp)}: expected the Trainer's fsdp options (a string or a list)`);
      const config = fsdpConfig(data);
      let version = "version" in config ? config.version : config.fsdp_version;
      if (version === undefined || version === null) {
        const major = majorOf((pins || {}).transformers);
        version = major !== null && major >= 5 ? 2 : 1;  // transformers' own default: FSDP2 from 5.0
        found.read.push(`no FSDP version: transformers ${(pins || {}).transformers || "(not given)"}'s default`);
      }
      found.setup.engine = "fsdp" + oneOf("fsdp_config.version", stage(version), [1, 2]);
      stateDict("fsdp_config.state_dict_type", "state_dict_type" in config ? config.state_dict_type : config.fsdp_state_dict_type, found.setup);
    }
    const reentrant = boolean("gradient_checkpointing_kwargs.use_reentrant", mapping(data, "gradient_checkpointing_kwargs").use_reentrant);
    if (reentrant) found.setup.use_reentrant = reentrant;
    const average = boolean("average_tokens_across_devices", data.average_tokens_across_devices);
    if (average) found.setup.average_tokens = average;
    if (data.gradient_accumulation_steps !== undefined && data.gradient_accumulation_steps !== null) {
      found.setup.accumulation = count("gradient_accumulation_steps", data.gradient_accumulation_steps) === 1 ? "none" : "several";
    }
    const adapter = trainerAdapter(data);
    if (adapter) found.setup.adapter = adapter;
    for (const flag of ["bf16", "fp16"]) if (boolean(flag, data[flag]) === "true") found.setup.precision = flag;
    return found;
  }
  // Which config a paste is: JSON with zero_optimization is DeepSpeed's; YAML with distributed_type accelerate's;
  // anything else the Trainer's arguments.
  function kindOf(text) {
    const body = String(text).replace(/^\uFEFF/, "").trim();
    if (body.startsWith("{") && /"zero_optimization"/.test(body)) return "deepspeed";
    if (/^distributed_type\s*:/m.test(body)) return "accelerate";
    return "trainer";
  }
  function readConfig(text, kind, pins) {
    const which = kind && kind !== "auto" ? kind : kindOf(text);
    if (/\u0000/.test(text)) throw new NotRead("not a text config (it holds NUL bytes)");
    const found = which === "accelerate" ? readAccelerate(text) : which === "deepspeed" ? readDeepspeed(text) : readTrainer(text, pins);
    found.kind = which;
    return found;
  }
  const api = { readConfig, kindOf, parseYaml, NotRead };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.CompatConfig = api;
})(this);
