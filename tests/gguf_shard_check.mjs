// Checks a shard file written by `engram shard` with an independent GGUF
// parser (npm @huggingface/gguf): the ds4-dialect keys of the unsharded
// model, the five shard keys with their exact types, the tables' shapes
// [264, block rows] by the floor formula, their offsets against `engram
// info --json` (second arg), tables last and table 0 page aligned.
// Usage: node tests/gguf_shard_check.mjs SHARD.gguf INFO.json
import { GGUFValueType, checker, open, readJson } from "./gguf_lib.mjs";

const [path, infoPath] = process.argv.slice(2);
const info = readJson(infoPath);
const { metadata, typedMetadata, tensorInfos, tensorDataOffset } = await open(path);
const { check, finish } = checker("gguf_shard_check", path);
const P = "deepseek41.engram.", S = P + "shard.";
const typed = (k) => typedMetadata[k] || {};
check(metadata["general.architecture"] === "deepseek41", "architecture");
check(typed(S + "rank").type === GGUFValueType.UINT32, "shard.rank is u32");
check(typed(S + "world").type === GGUFValueType.UINT32, "shard.world is u32");
check(typed(S + "model_id").type === GGUFValueType.STRING && /^[0-9a-f]{64}$/.test(metadata[S + "model_id"]), "shard.model_id 64 hex");
for (const k of ["first_row", "total_rows"])
  check(typed(S + k).type === GGUFValueType.ARRAY && typed(S + k).subType === GGUFValueType.UINT32 && metadata[S + k].length === 2, k + " u32[2]");
const rank = BigInt(metadata[S + "rank"]), world = BigInt(metadata[S + "world"]);
check(info.shard && BigInt(info.shard.rank) === rank && BigInt(info.shard.world) === world, "rank and world match info");
check(info.shard && info.shard.model_id === metadata[S + "model_id"], "model id matches info");
const rows = metadata[P + "rows"].map((x) => BigInt(x));
const primes = metadata[P + "primes"].map((x) => BigInt(x));
const byName = Object.fromEntries(tensorInfos.map((t) => [t.name, t]));
const abs = (t) => tensorDataOffset + t.offset;
const layers = [1, 14];
for (let t = 0; t < 2; t++) {
  const R = rows[t];
  check(primes.slice(24 * t, 24 * t + 24).reduce((a, b) => a + b, 0n) === R, `table ${t}: sum of primes = rows (the unsharded R)`);
  check(BigInt(metadata[S + "total_rows"][t]) === R, `table ${t}: total_rows = rows`);
  const lo = (rank * R) / world, hi = ((rank + 1n) * R) / world;
  check(BigInt(metadata[S + "first_row"][t]) === lo, `table ${t}: first_row = floor(rank R / world)`);
  const ten = byName[`blk.${layers[t]}.engram_embd.weight`];
  check(!!ten && ten.dtype === 24, `table ${t} present, I8`);
  if (!ten) continue;
  check(ten.shape.length === 2 && BigInt(ten.shape[0]) === 264n && BigInt(ten.shape[1]) === hi - lo, `table ${t} shape [264, ${hi - lo}]`);
  check(abs(ten) === BigInt(info.tables[t].offset), `table ${t} offset agrees with info`);
  check(BigInt(info.shard.first_row[t]) === lo && BigInt(info.shard.rows[t]) === hi - lo, `table ${t} block agrees with info`);
}
const t0 = byName["blk.1.engram_embd.weight"], t1 = byName["blk.14.engram_embd.weight"];
if (t0 && t1) {
  const others = tensorInfos.filter((t) => t !== t0 && t !== t1);
  check(abs(t0) < abs(t1) && others.every((t) => tensorDataOffset + t.offset < abs(t0)), "tables last");
  check(abs(t0) % 4096n === 0n, "table 0 page aligned");
  check(abs(t1) + BigInt(t1.shape[1]) * 264n <= BigInt(info.file_bytes), "table 1 inside the file");
}
finish();
