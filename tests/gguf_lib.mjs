// What the independent GGUF checks share: the npm parser @huggingface/gguf
// (not this project's), a file opened with its typed metadata, and a
// counter of checks that prints each failure and ends the process with
// "NAME FILE: N checks, N failed" (exit 1 if any failed).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";
const require = createRequire(new URL("../tools/node/package.json", import.meta.url));
export const { gguf, GGUFValueType } = require("@huggingface/gguf");

// { metadata, typedMetadata, tensorInfos, tensorDataOffset } of the file
export const open = (path) => gguf(resolve(path), { allowLocalFile: true, typedMetadata: true });

export const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));

export function checker(name, path) {
  let failed = 0, checks = 0;
  return {
    check(cond, what) {
      checks++;
      if (!cond) {
        failed++;
        console.error("FAIL: " + what);
      }
    },
    finish() {
      console.log(`${name} ${path}: ${checks} checks, ${failed} failed`);
      process.exit(failed ? 1 : 0);
    },
  };
}
