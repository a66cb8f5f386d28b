// What the user has, read in the browser as `compat-matrix audit` reads it (harness/tools/answers/audit.py's readers): a
// requirements file, pip freeze or lock, and packaging's versions and specifiers as far as pins and ranges need them.
// Reading only: the judging is judge.js, over the tables Python compiled. tests/test_site_answer.py holds the page and
// audit to the same answers on the same pasted inputs.
(function (root) {
  "use strict";

  // --- versions: packaging's Version, as far as the feed and users' pins need it -------------------------------
  const VERSION = /^\s*v?(?:(\d+)!)?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?(?:(?:-(\d+))|(?:[-_.]?(post|rev|r)[-_.]?(\d*)))?(?:[-_.]?(dev)[-_.]?(\d*))?\s*$/i;

  function publicVersion(v) { return String(v).split("+", 1)[0]; }

  function parseVersion(v) {
    const m = VERSION.exec(publicVersion(v));
    if (!m) return null;
    const pre = m[3] ? [{ a: 0, alpha: 0, b: 1, beta: 1, c: 2, rc: 2, pre: 2, preview: 2 }[m[3].toLowerCase()], Number(m[4] || 0)] : null;
    const post = m[5] !== undefined ? Number(m[5]) : (m[6] ? Number(m[7] || 0) : null);
    const dev = m[8] ? Number(m[9] || 0) : null;
    return { epoch: Number(m[1] || 0), release: m[2].split(".").map(Number), pre, post, dev };
  }

  // Python's Version(public_version(v)).release: the release numbers, compared as tuples (2.5 < 2.5.0).
  function releaseKey(v) {
    const parsed = parseVersion(v);
    if (!parsed) throw new Error(`not a version: ${v}`);
    return parsed.release;
  }
  function cmpTuple(a, b) {
    for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
    return a.length === b.length ? 0 : (a.length < b.length ? -1 : 1);
  }
  function cmpRelease(a, b) { return cmpTuple(releaseKey(a), releaseKey(b)); }

  // packaging's full ordering (trailing zeros of the release dropped; dev < pre < final < post).
  function versionKey(v) {
    const p = parseVersion(v);
    const release = p.release.slice();
    while (release.length > 1 && release[release.length - 1] === 0) release.pop();
    const pre = p.pre ? p.pre : (p.post === null && p.dev !== null ? [-Infinity] : [Infinity]);
    return [p.epoch, release, pre, p.post === null ? -Infinity : p.post, p.dev === null ? Infinity : p.dev];
  }
  function cmpVersion(a, b) {
    const x = versionKey(a), y = versionKey(b);
    if (x[0] !== y[0]) return x[0] < y[0] ? -1 : 1;
    const r = cmpTuple(x[1], y[1]);
    if (r) return r;
    const q = cmpTuple(x[2], y[2]);
    if (q) return q;
    for (const i of [3, 4]) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
  }
  function isPrerelease(v) { const p = parseVersion(v); return !!p && (p.pre !== null || p.dev !== null); }

  // --- requirements and specifiers ----------------------------------------------------------------------------
  function canonicalName(name) { return name.replace(/[-_.]+/g, "-").toLowerCase(); }

  const REQUIREMENT = /^[ \t]*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)[ \t]*(\[[^\]]*\])?[ \t]*\(?[ \t]*([^;()]*?)[ \t]*\)?[ \t]*(;.*)?$/;
  const URL_REQUIREMENT = /^[ \t]*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)[ \t]*(\[[^\]]*\])?[ \t]*@[ \t]*(\S+)[ \t]*(;.*)?$/;
  const SPECIFIER = /^(~=|===|==|!=|<=|>=|<|>)\s*([^\s,;]+)$/;

  // packaging's Requirement, as far as requirements files need it: name, extras, specifiers or `@ URL`, a marker.
  function parseRequirement(line) {
    const u = URL_REQUIREMENT.exec(line);
    if (u) {
      if (u[4] !== undefined && !/[ \t]$/.test(line.slice(0, line.length - u[4].length))) return null;  // URL then ;: no space
      return { name: u[1], extras: u[2] || "", specs: [], marker: u[4] || "", url: u[3] };
    }
    const m = REQUIREMENT.exec(line);
    if (!m) return null;
    if (m[2] && !/^\[[ \t]*(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:[ \t]*,[ \t]*[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)*)?[ \t]*\]$/.test(m[2])) return null;
    const specs = [];
    if (m[3]) {
      for (const part of m[3].split(",")) {
        const s = SPECIFIER.exec(part.trim());
        if (!s) return null;
        if (!validSpecifier(s[1], s[2])) return null;
        specs.push({ operator: s[1], version: s[2] });
      }
    }
    return { name: m[1], extras: m[2] || "", specs, marker: m[4] || "", url: null };
  }

  // str(SpecifierSet): each specifier without spaces, sorted.
  function specifierText(specs) { return [...new Set(specs.map((s) => s.operator + s.version))].sort().join(","); }

  function specifierContains(spec, v) {
    const op = spec.operator, want = spec.version;
    if (op === "===") return String(v) === want;
    if (op === "==" || op === "!=") {
      let hit;
      if (want.endsWith(".*")) {
        const prefix = releaseKey(want.slice(0, -2));
        const have = releaseKey(v).slice();
        while (have.length < prefix.length) have.push(0);
        hit = prefix.every((n, i) => have[i] === n);
      } else {
        hit = cmpVersion(want.includes("+") ? v : publicVersion(v), want) === 0;
      }
      return op === "==" ? hit : !hit;
    }
    if (op === "~=") {
      const key = releaseKey(want);
      const prefix = key.slice(0, -1).join(".");
      return cmpVersion(v, want) >= 0 && specifierContains({ operator: "==", version: prefix + ".*" }, v);
    }
    const c = cmpVersion(publicVersion(v), want);
    if (op === "<=") return c <= 0;
    if (op === ">=") return c >= 0;
    if (op === "<") return c < 0 && !(isPrerelease(v) && cmpTuple(releaseKey(v), releaseKey(want)) === 0);
    if (op === ">") return c > 0 && !(parseVersion(v).post !== null && cmpTuple(releaseKey(v), releaseKey(want)) === 0);
    return false;
  }
  // SpecifierSet.contains: every specifier holds; a pre-release only where a specifier names one.
  function setContains(specs, v, prereleases) {
    if (!prereleases && isPrerelease(v) && !specs.some((s) => isPrerelease(s.version.replace(/\.\*$/, "")))) return false;
    return specs.every((s) => specifierContains(s, v));
  }

  // --- environment markers (packaging 26's Marker, for one target: tools/target.py) ---------------------------
  // The target's marker variables: target.py's Target.environment for a system, machine and Python.
  const SYSTEMS = { linux: ["linux", "Linux", "posix"], windows: ["win32", "Windows", "nt"], macos: ["darwin", "Darwin", "posix"] };
  function markerEnvironment(target) {
    const t = target || { system: "linux", machine: "x86_64", python: "3.12" };
    const full = t.python.split(".").length >= 3 ? t.python : t.python + ".0";
    const [sysPlatform, system, osName] = SYSTEMS[t.system];
    return { implementation_name: "cpython", implementation_version: full, os_name: osName, platform_machine: t.machine,
      platform_release: "", platform_system: system, platform_version: "", python_full_version: full,
      platform_python_implementation: "CPython", python_version: full.split(".").slice(0, 2).join("."), sys_platform: sysPlatform };
  }
  const MARKER_VARIABLES = /^(python_version|python_full_version|os[._]name|sys[._]platform|platform_(?:release|system)|platform[._](?:version|machine|python_implementation)|python_implementation|implementation_(?:name|version)|extras?|dependency_groups)\b/;
  const VERSION_KEYS = new Set(["implementation_version", "platform_release", "python_full_version", "python_version"]);
  function canonicalKey(name) {
    const k = name.replace(".", "_");
    return k === "python_implementation" || k === "platform_python_implementation" ? "platform_python_implementation" : k;
  }
  // Tokens, then or / and / atoms with parentheses, as packaging's _parser reads a marker.
  function markerTokens(text) {
    const out = [];
    let at = 0;
    while (at < text.length) {
      const rest = text.slice(at);
      let m;
      if ((m = /^[ \t]+/.exec(rest))) { at += m[0].length; continue; }
      if ((m = /^('[^']*'|"[^"]*")/.exec(rest))) out.push({ kind: "string", text: m[0].slice(1, -1) });
      else if ((m = /^(===|==|~=|!=|<=|>=|<|>)/.exec(rest))) out.push({ kind: "op", text: m[0] });
      else if ((m = /^(or|and)\b/.exec(rest))) out.push({ kind: m[0], text: m[0] });
      else if ((m = /^not\b/.exec(rest))) out.push({ kind: "not", text: m[0] });
      else if ((m = /^in\b/.exec(rest))) out.push({ kind: "in", text: m[0] });
      else if ((m = MARKER_VARIABLES.exec(rest)) && /^\b/.test(rest)) out.push({ kind: "variable", text: canonicalKey(m[0]) });
      else if (rest[0] === "(" || rest[0] === ")") { m = [rest[0]]; out.push({ kind: rest[0], text: rest[0] }); }
      else throw new Error(`not an environment marker: ${JSON.stringify(text.slice(0, 80))}`);
      at += m[0].length;
    }
    return out;
  }
  function parseMarker(text) {
    const tokens = markerTokens(text);
    let at = 0;
    const fail = () => { throw new Error(`not an environment marker: ${JSON.stringify(text.slice(0, 80))}`); };
    const value = () => { const t = tokens[at++]; if (!t || (t.kind !== "variable" && t.kind !== "string")) fail(); return t; };
    function atom() {
      if (tokens[at] && tokens[at].kind === "(") { at++; const inner = or(); if (!tokens[at] || tokens[at].kind !== ")") fail(); at++; return inner; }
      const lhs = value();
      let op;
      if (tokens[at] && tokens[at].kind === "in") { op = "in"; at++; }
      else if (tokens[at] && tokens[at].kind === "not" && tokens[at + 1] && tokens[at + 1].kind === "in") { op = "not in"; at += 2; }
      else if (tokens[at] && tokens[at].kind === "op") op = tokens[at++].text;
      else fail();
      const rhs = value();
      return { lhs, op, rhs };
    }
    function and() { const items = [atom()]; while (tokens[at] && tokens[at].kind === "and") { at++; items.push(atom()); } return { all: items }; }
    function or() { const items = [and()]; while (tokens[at] && tokens[at].kind === "or") { at++; items.push(and()); } return { any: items }; }
    if (!tokens.length) fail();
    const tree = or();
    if (at !== tokens.length) fail();
    return tree;
  }
  function validSpecifier(op, version) {
    if (op === "===") return /^\S+$/.test(version);
    if (version.endsWith(".*")) return (op === "==" || op === "!=") && !!parseVersion(version.slice(0, -2)) && !/[+]/.test(version);
    const p = parseVersion(version);
    if (!p) return false;
    if (op === "~=") return p.release.length >= 2 && !version.includes("+");
    if (version.includes("+")) return op === "==" || op === "!=";
    return true;
  }
  function compare(lhs, op, rhs, key) {
    if (VERSION_KEYS.has(key) && validSpecifier(op, rhs)) {
      return parseVersion(lhs) ? specifierContains({ operator: op, version: rhs }, lhs) : false;
    }
    const strings = { in: () => rhs.includes(lhs), "not in": () => !rhs.includes(lhs), "<": () => false, "<=": () => lhs === rhs,
      "==": () => lhs === rhs, "!=": () => lhs !== rhs, ">=": () => lhs === rhs, ">": () => false };
    if (!strings[op]) throw new Error(`the marker cannot be evaluated: ${op} on ${JSON.stringify(lhs)} and ${JSON.stringify(rhs)}`);
    return strings[op]();
  }
  // context "lock_file" (a PEP 751 lock): extras and dependency_groups are empty sets; else extra is "".
  function evaluateMarker(tree, environment, context) {
    const env = Object.assign({}, environment, context === "lock_file" ? { extras: [], dependency_groups: [] } : { extra: "" });
    const lookup = (name) => { if (!(name in env)) throw new Error(`the marker cannot be evaluated: ${name} is not defined`); return env[name]; };
    function atom(a) {
      if (a.any) return a.any.some(atom);
      if (a.all) return a.all.every(atom);
      const key = a.lhs.kind === "variable" ? a.lhs.text : a.rhs.text;
      let lhs = a.lhs.kind === "variable" ? lookup(a.lhs.text) : a.lhs.text;
      let rhs = a.rhs.kind === "variable" ? lookup(a.rhs.text) : a.rhs.text;
      if (Array.isArray(lhs) || Array.isArray(rhs)) {  // extras / dependency_groups: names in a set
        if (!Array.isArray(rhs) || !["in", "not in"].includes(a.op)) throw new Error(`the marker cannot be evaluated: ${key}`);
        const hit = rhs.map(canonicalName).includes(canonicalName(lhs));
        return a.op === "in" ? hit : !hit;
      }
      if (key === "extra") { if (a.lhs.kind === "variable") rhs = canonicalName(rhs); else lhs = canonicalName(lhs); }
      return compare(lhs, a.op, rhs, key);
    }
    return atom(tree);
  }

  // --- pip's requirements-file grammar (tools/pip_requirements.py, ported) ------------------------------------
  // Python's whitespace (str.isspace, re's \s), not JavaScript's (which takes in the byte-order mark).
  const WS = "[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
  const COMMENT_START = new RegExp(`^(${WS}+)?#`);
  const pyStrip = (s) => s.replace(new RegExp(`^${WS}+|${WS}+$`, "g"), "");
  // str.splitlines's line ends.
  const LINE_ENDS = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/;
  const MOST_LINES = 20000, LONGEST_LINE = 1024 * 1024;
  // pip's COMMENT.sub then strip, in linear time: cut at the first # at the start or after whitespace.
  const COMMENT_CUT = new RegExp(`(?:^|(?<=${WS}))#`);
  function withoutComment(raw) { const m = COMMENT_CUT.exec(raw); return pyStrip(m ? raw.slice(0, m.index) : raw); }
  function logicalLines(text) {
    const physical = text.split(LINE_ENDS);
    if (physical.length && physical[physical.length - 1] === "" && LINE_ENDS.test(text.slice(-2))) physical.pop();
    const joined = [];
    let pending = [], first = 0;
    physical.forEach((raw, index) => {
      const number = index + 1;
      if (!raw.endsWith("\\") || COMMENT_START.test(raw)) {
        if (COMMENT_START.test(raw)) raw = " " + raw;
        if (pending.length) { pending.push(raw); joined.push([first, pending.join("")]); pending = []; }
        else joined.push([number, raw]);
      } else {
        if (!pending.length) first = number;
        pending.push(raw.replace(/^\\+|\\+$/g, ""));
      }
      if (joined.length > MOST_LINES) throw new Error(`more than ${MOST_LINES} lines: not a requirements file this page reads`);
    });
    if (pending.length) joined.push([first, pending.join("")]);
    const lines = [];
    for (const [number, raw] of joined) {
      if (raw.length > LONGEST_LINE) throw new Error(`line ${number}: a line of ${raw.length} characters: not a requirement`);
      const line = withoutComment(raw);
      if (line) lines.push([number, line]);
    }
    return lines;
  }
  function breakArgsOptions(line) {
    const tokens = line.split(" ");
    const args = [];
    for (const token of tokens) { if (token.startsWith("-")) break; args.push(token); }
    return [args.join(" "), tokens.slice(args.length).join(" ")];
  }
  // Python's shlex.split (POSIX mode).
  function shlexSplit(text) {
    const words = [];
    let word = null, quote = null;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (quote === "'") { if (c === "'") quote = null; else word += c; continue; }
      if (quote === '"') {
        if (c === '"') quote = null;
        else if (c === "\\" && (text[i + 1] === '"' || text[i + 1] === "\\")) word += text[++i];
        else word += c;
        continue;
      }
      if (" \t\r\n".includes(c)) { if (word !== null) { words.push(word); word = null; } continue; }
      if (word === null) word = "";
      if (c === "'" || c === '"') quote = c;
      else if (c === "\\") { if (i + 1 >= text.length) throw new Error("No escaped character"); word += text[++i]; }
      else word += c;
    }
    if (quote) throw new Error("No closing quotation");
    if (word !== null) words.push(word);
    return words;
  }
  const VALUED = { "-i": "--index-url", "-c": "--constraint", "-r": "--requirement", "-e": "--editable", "-f": "--find-links", "-C": "--config-settings" };
  const LONG_VALUED = ["--index-url", "--extra-index-url", "--constraint", "--requirement", "--editable", "--find-links", "--no-binary",
    "--only-binary", "--trusted-host", "--use-feature", "--global-option", "--hash", "--config-settings"];
  const FLAGS = ["--no-index", "--prefer-binary", "--require-hashes", "--pre"];
  const LONG = LONG_VALUED.concat(FLAGS).sort();
  function parseOptions(where, options) {
    let words;
    try { words = shlexSplit(options); } catch (e) { throw new Error(`${where}: could not split the options: ${e.message}`); }
    const found = {};
    for (let at = 0; at < words.length;) {
      const word = words[at++];
      if (word === "--") break;
      if (!word.startsWith("-") || word === "-") continue;
      let name, value = null;
      if (word.startsWith("--")) {
        const eq = word.indexOf("=");
        name = eq < 0 ? word : word.slice(0, eq);
        if (!LONG.includes(name)) {
          const matches = LONG.filter((o) => o.startsWith(name));
          if (matches.length !== 1) throw new Error(`${where}: ${name} ${matches.length ? "is ambiguous" : "is no option pip reads in a requirements file"}`);
          name = matches[0];
        }
        if (eq >= 0) value = word.slice(eq + 1);
        if (FLAGS.includes(name)) { if (eq >= 0) throw new Error(`${where}: ${name} takes no value`); (found[name] = found[name] || []).push(""); continue; }
      } else {
        name = word.slice(0, 2);
        if (!VALUED[name]) throw new Error(`${where}: ${name} is no option pip reads in a requirements file`);
        value = word.slice(2) || null;
        name = VALUED[name];
      }
      if (value === null) { if (at >= words.length) throw new Error(`${where}: ${name} requires a value`); value = words[at++]; }
      (found[name] = found[name] || []).push(value);
    }
    return found;
  }
  const VCS = ["git", "hg", "svn", "bzr"];
  const URL_SCHEMES = new Set(["http", "https", "file", "ftp", ...VCS,
    ...VCS.flatMap((v) => ["http", "https", "ssh", "file", "git", "svn", "sftp", "ftp", "lp", "static-http"].map((s) => `${v}+${s}`))]);
  const ARCHIVES = [".whl", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma", ".tar.gz", ".tgz", ".tar", ".zip"];
  function isUrl(text) { return text.includes(":") && URL_SCHEMES.has(text.split(":", 1)[0].toLowerCase()); }
  const looksLikePath = (t) => t.includes("/") || t.includes("\\") || t.startsWith(".");
  function fileName(link) {
    let path = link;
    if (isUrl(link)) { try { path = decodeURIComponent(new URL(link).pathname); } catch (e) { path = link.replace(/^[^:]+:\/*[^/]*/, "").split(/[?#]/)[0]; } }
    return path.replace(/\/+$/, "").replace(/\\/g, "/").split("/").pop();
  }
  function wheelName(where, filename) {
    const parts = filename.slice(0, -4).split("-");
    if ((parts.length !== 5 && parts.length !== 6) || !parseVersion(parts[1]) || !/^[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?$/.test(parts[0])) {
      throw new Error(`${where}: ${JSON.stringify(filename)} is not a wheel's file name`);
    }
    return [canonicalName(parts[0]), normalVersion(parts[1])];
  }
  function sdistName(filename) {
    const lower = filename.toLowerCase();
    const ext = ARCHIVES.find((e) => e !== ".whl" && lower.endsWith(e));
    if (!ext) return null;
    const stem = filename.slice(0, -ext.length);
    const dash = stem.lastIndexOf("-");
    if (dash <= 0 || !parseVersion(stem.slice(dash + 1))) return null;
    return [canonicalName(stem.slice(0, dash)), normalVersion(stem.slice(dash + 1))];
  }
  // str(Version(v)): packaging's normal form (enough for file names: epoch, release, pre, post, dev, local).
  function normalVersion(v) {
    const p = parseVersion(v);
    const local = String(v).includes("+") ? "+" + String(v).split("+")[1].toLowerCase().replace(/[-_]/g, ".") : "";
    const pre = p.pre ? ["a", "b", "rc"][p.pre[0]] + p.pre[1] : "";
    return (p.epoch ? p.epoch + "!" : "") + p.release.join(".") + pre + (p.post !== null ? ".post" + p.post : "") + (p.dev !== null ? ".dev" + p.dev : "") + local;
  }
  function requirementLine(where, text, environment) {
    const line = { where, text, name: null, specs: [], release: null, namedBy: "", marker: null, holds: true, url: null };
    let name = text;
    const separator = isUrl(text) ? "; " : ";";
    const cut = name.indexOf(separator);
    if (cut >= 0) {
      const said = pyStrip(name.slice(cut + separator.length));
      name = name.slice(0, cut);
      if (said) {
        line.marker = said;
        try { line.holds = evaluateMarker(parseMarker(said), environment); } catch (e) { throw new Error(`${where}: ${e.message}`); }
      }
    }
    name = pyStrip(name);
    let link = null;
    if (isUrl(name)) link = name;
    else {
      const extras = /^(.+)(\[[^\]]+\])$/.exec(name);
      const path = extras ? extras[1] : name;
      const at = name.indexOf("@");
      if (ARCHIVES.some((e) => path.toLowerCase().endsWith(e)) && (at < 0 || looksLikePath(name.slice(0, at)))) link = path;
      else if (looksLikePath(name) && !parseRequirement(name)) { line.url = name; return line; }
    }
    if (link !== null) {
      line.url = link;
      const filename = fileName(link);
      if (filename.toLowerCase().endsWith(".whl")) {
        [line.name, line.release] = wheelName(where, filename);
        line.namedBy = "wheel file name";
        line.specs = [{ operator: "==", version: line.release }];
      } else {
        const egg = /[#&]egg=([^&]*)/.exec(link);
        line.name = egg && egg[1] ? canonicalName(egg[1]) : null;
        bySdist(line, filename);
      }
      return line;
    }
    const requirement = parseRequirement(name);
    if (!requirement) throw new Error(`${where}: ${JSON.stringify(name.slice(0, 80))} is not a requirement`);
    line.name = canonicalName(requirement.name);
    line.specs = requirement.specs;
    if (requirement.url) {
      line.url = requirement.url;
      const filename = fileName(requirement.url);
      const wheel = filename.toLowerCase().endsWith(".whl") ? wheelName(where, filename) : null;
      if (wheel && wheel[0] === line.name) { line.release = wheel[1]; line.namedBy = "wheel file name"; }
      else bySdist(line, filename);
      return line;
    }
    const exact = requirement.specs.filter((s) => (s.operator === "==" || s.operator === "===") && !s.version.includes("*"));
    if (exact.length) line.release = exact[0].version;
    return line;
  }
  function bySdist(line, filename) {
    const found = sdistName(filename);
    if (found && (line.name === null || line.name === found[0])) { [line.name, line.release] = found; line.namedBy = "sdist file name"; }
  }
  function editableLine(where, target) {
    const egg = /[#&]egg=([^&]*)/.exec(target);
    return { where, text: "-e " + target, name: egg && egg[1] ? canonicalName(egg[1]) : null, specs: [], release: null, namedBy: "", marker: null, holds: true, url: target, editable: true };
  }
  function requirementLines(text, environment) {
    const lines = [];
    for (const [number, line] of logicalLines(text)) {
      const where = `line ${number}`;
      const [args, options] = breakArgsOptions(line);
      const opts = parseOptions(where, options);
      if (args) lines.push(requirementLine(where, args, environment));
      else if (opts["--editable"]) lines.push(editableLine(where, opts["--editable"][0]));
      else if (opts["--requirement"] || opts["--constraint"]) {
        throw new Error(`${where}: ${JSON.stringify(line.slice(0, 80))} includes another file: paste that file too`);
      }
    }
    return lines;
  }

  // --- what the user has (user_files.read_file) -----------------------------------------------------------------
  // What each judged package always installs: a file that lists one beside each judged package it pins is a pip freeze
  // or a compiled file, a complete environment (user_files.ALWAYS_WITH).
  const ALWAYS_WITH = {
    torch: ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"],
    transformers: ["huggingface-hub", "tokenizers", "safetensors", "regex", "tqdm", "filelock", "pyyaml"],
    peft: ["psutil", "safetensors", "huggingface-hub", "tqdm", "pyyaml", "accelerate"],
    accelerate: ["psutil", "huggingface-hub", "safetensors", "pyyaml", "numpy"],
    deepspeed: ["hjson", "ninja", "psutil", "py-cpuinfo", "pydantic", "tqdm"],
    bitsandbytes: ["numpy"],
  };
  const JUDGED = Object.keys(ALWAYS_WITH);
  function looksLikeLock(text) { return /^\s*\[\[(package|packages)\]\]\s*$/m.test(text); }
  function looksLikeConda(text) { return /^@EXPLICIT\s*$/m.test(text) || /^(dependencies|channels)\s*:/m.test(text); }

  // -> {pins, loose, unnamed, complete, kind, notes}; throws on bad input. target: {system, machine, python}.
  function readPins(text, kind, target) {
    text = String(text).replace(/^\ufeff/, "");
    if (text.includes("\u0000")) throw new Error("not a text (it holds NUL characters)");
    const environment = markerEnvironment(target);
    kind = kind || (looksLikeLock(text) ? "lock" : looksLikeConda(text) ? "conda" : "requirements");
    if (kind === "conda") throw new Error("a conda environment.yml: not read on this page; give it to `compat-matrix audit`, or paste `pip freeze` of that environment");
    const read = kind === "lock" ? lockPins(text, environment) : foldLines(requirementLines(text, environment));
    read.kind = kind === "lock" ? "lock" : read.complete ? "freeze" : "requirements";
    if (!Object.keys(read.pins).length && !read.loose.length && !read.unnamed.length) throw new Error("read as nothing: no requirement and no locked package in it");
    const named = new Set(Object.keys(read.pins).concat(read.loose.map((l) => canonicalName((parseRequirement(l) || { name: "" }).name))));
    if (!JUDGED.some((p) => named.has(p))) throw new Error(`names none of ${JUDGED.join(", ")}: nothing to judge`);
    return read;
  }
  function foldLines(lines) {
    const found = { pins: {}, loose: [], unnamed: [], complete: false, notes: [] };
    const where = {}, said = {};
    const skipped = lines.filter((l) => !l.holds);
    if (skipped.length) found.notes.push(`${skipped.length} line(s) not for this machine (their markers)`);
    for (const line of lines.filter((l) => l.holds)) {
      if (line.name === null || (line.release === null && (line.url || line.editable))) { found.unnamed.push(line.text.slice(0, 120)); continue; }
      (said[line.name] = said[line.name] || []).push(line);
      if (line.release !== null) {
        if (line.name in found.pins && found.pins[line.name] !== line.release) {
          throw new Error(`${line.where}: ${line.name} ${line.release}, and ${line.name} ${found.pins[line.name]} at ${where[line.name]}: two releases of one package for the same machine`);
        }
        found.pins[line.name] = line.release;
        where[line.name] = where[line.name] || line.where;
      }
    }
    for (const [name, named] of Object.entries(said)) {
      if (!(name in found.pins)) { found.loose.push(name + specifierText(named.flatMap((l) => l.specs))); continue; }
      const outside = named.find((l) => !setContains(l.specs, found.pins[name], true));
      if (outside) throw new Error(`${outside.where}: ${name}${specifierText(outside.specs)} excludes ${name} ${found.pins[name]} (${where[name]})`);
    }
    const listed = new Set(Object.keys(found.pins).concat(lines.filter((l) => l.name).map((l) => l.name)));
    found.complete = !found.loose.length && JUDGED.some((p) => p in found.pins)
      && !lines.some((l) => l.holds && l.release === null && !(l.url || l.editable))
      && !lines.some((l) => l.holds && l.release === null && JUDGED.includes(l.name))  // torch @ file:///...: release unknown
      && JUDGED.filter((p) => p in found.pins).every((p) => ALWAYS_WITH[p].some((d) => listed.has(d)));
    return found;
  }

  // uv.lock, poetry.lock ([[package]]) and pylock.toml ([[packages]]): each entry's name, version and markers
  // (uv's resolution-markers, PEP 751's marker), the entry whose markers hold on the target (user_locks.read_lock).
  function lockPins(text, environment) {
    const entries = [];
    let entry = null, any = false, array = null, pylock = false;
    const close = () => { if (entry !== null) entries.push(entry); entry = null; };
    for (const raw of text.split(/\r?\n/)) {
      if (array !== null) {
        for (const m of raw.matchAll(/"((?:[^"\\]|\\.)*)"|'([^']*)'/g)) array.push(m[1] !== undefined ? JSON.parse(`"${m[1]}"`) : m[2]);
        if (/\]\s*(#.*)?$/.test(raw)) array = null;
        continue;
      }
      const header = /^\s*\[\[(package|packages)\]\]\s*$/.exec(raw);
      if (header) { close(); entry = { number: entries.length + 1 }; any = true; pylock = header[1] === "packages"; continue; }
      if (/^\s*\[/.test(raw)) { close(); continue; }  // another table: that entry's keys end
      if (entry === null) continue;
      const m = /^(name|version|marker)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(#.*)?$/.exec(raw);
      if (m) { entry[m[1]] = m[2] !== undefined ? JSON.parse(`"${m[2]}"`) : m[3]; continue; }
      const list = /^resolution-markers\s*=\s*\[(.*)$/.exec(raw);
      if (list) {
        entry.markers = [];
        for (const s of list[1].matchAll(/"((?:[^"\\]|\\.)*)"|'([^']*)'/g)) entry.markers.push(s[1] !== undefined ? JSON.parse(`"${s[1]}"`) : s[2]);
        if (!/\]\s*(#.*)?$/.test(list[1])) array = entry.markers;
      }
    }
    close();
    if (!any) throw new Error("no [[package]] or [[packages]] table: not a uv, poetry or PEP 751 lock");
    const poetry = /^\s*content-hash\s*=/m.test(text) || text.slice(0, 200).includes("by Poetry");
    const chosen = {}, held = {};
    for (const e of entries) {
      if (!("name" in e)) throw new Error(`package entry ${e.number} has no name`);
      if (!e.version) continue;
      if (!parseVersion(e.version)) throw new Error(`package entry ${e.number} (${e.name}): version ${JSON.stringify(e.version)} is not a version`);
      const name = canonicalName(e.name);
      (held[name] = held[name] || []).push(e.version);
      const markers = pylock ? (e.marker !== undefined ? [e.marker] : null) : (e.markers || null);
      const holds = markers === null || markers.some((m) => {
        try { return evaluateMarker(parseMarker(m), environment, pylock ? "lock_file" : "metadata"); } catch (err) { throw new Error(`package entry ${e.number}: the marker ${JSON.stringify(m)} cannot be read`); }
      });
      if (holds) (chosen[name] = chosen[name] || new Set()).add(e.version);
    }
    const pins = {}, notes = [];
    for (const name of Object.keys(held)) {
      const picked = [...(chosen[name] || [])];
      if (picked.length > 1) {
        throw new Error(`${name} is locked at ${picked.sort(cmpVersion).join(" and ")} for this machine (${poetry ? "one release per package; its dependents' markers choose" : "their markers overlap"})`);
      }
      if (picked.length) pins[name] = picked[0];
      else notes.push(`${name} is locked for other targets only: not installed here`);
    }
    return { pins, loose: [], unnamed: [], complete: true, notes };
  }

  // audit.loose_ranges: package -> its specifiers, for a requirement that pins no release.
  function looseRanges(loose) {
    const found = {};
    for (const line of loose) {
      const r = parseRequirement(line);
      if (r) found[canonicalName(r.name)] = r.specs;
    }
    return found;
  }

  const api = { readPins, looseRanges, releaseKey, cmpRelease, setContains, parseRequirement, canonicalName, markerEnvironment,
    parseMarker, evaluateMarker, logicalLines, parseOptions, requirementLine, ALWAYS_WITH };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.CompatRead = api;
})(typeof window !== "undefined" ? window : this);
