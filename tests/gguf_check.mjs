// Checks a model written by this project with an independent GGUF parser
// (npm @huggingface/gguf): the ds4-dialect keys with their exact types and
// lengths, tensor shapes and types, and that the table offsets it computes
// agree with what `engram info --json` reports (given as the second arg).
// Exit 0 if all hold; prints each failed check.
// Usage: node tests/gguf_check.mjs MODEL.gguf INFO.json
import { GGUFValueType, checker, open, readJson } from "./gguf_lib.mjs";

const [path, infoPath] = process.argv.slice(2);
const info = readJson(infoPath);
const { metadata, typedMetadata, tensorInfos, tensorDataOffset } = await open(path);
const { check, finish } = checker("gguf_check", path);
const P = "deepseek41.engram.";
const typed = (k) => typedMetadata[k] || {};
check(metadata["general.architecture"] === "deepseek41", "architecture");
check(typed(P + "encoding").type === GGUFValueType.STRING && metadata[P + "encoding"] === "e4m3_e8m0_32_row264", "encoding string");
check(typed(P + "compressed_vocab_size").type === GGUFValueType.UINT32, "compressed_vocab_size is u32");
check(metadata[P + "compressed_vocab_size"] === info.compressed_vocab, "V' matches info");
check(typed(P + "pad_id").type === GGUFValueType.UINT32 && metadata[P + "pad_id"] === info.pad_id, "pad_id u32 and matches");
const arr = (k, sub, len) => {
  const t = typed(P + k);
  check(t.type === GGUFValueType.ARRAY && t.subType === sub, k + " is an array of the right type");
  check(Array.isArray(metadata[P + k]) && metadata[P + k].length === len, k + " has length " + len);
  return (metadata[P + k] || []).map((x) => BigInt(x));
};
const map = arr("token_map", GGUFValueType.UINT32, info.vocab);
const rows = arr("rows", GGUFValueType.UINT32, 2);
const primes = arr("primes", GGUFValueType.UINT32, 48);
const mult = arr("multipliers", GGUFValueType.UINT64, 8);
const V = BigInt(info.compressed_vocab);
check(map.every((x) => x < V), "token_map entries < V'");
const bound = (2n ** 63n - 1n) / V;
check(mult.every((m) => m % 2n === 1n && m <= bound), "multipliers odd and within bound");
for (let t = 0; t < 2; t++) {
  const sum = primes.slice(24 * t, 24 * t + 24).reduce((a, b) => a + b, 0n);
  check(sum === rows[t], `table ${t}: sum of primes = rows`);
  check(BigInt(info.tables[t].rows) === rows[t], `table ${t}: rows match info`);
  check(mult.slice(4 * t, 4 * t + 4).join(",") === info.tables[t].multipliers.join(","), `table ${t}: multipliers match info`);
}
const byName = Object.fromEntries(tensorInfos.map((t) => [t.name, t]));
const abs = (t) => tensorDataOffset + t.offset;
const layers = [1, 14];
for (let t = 0; t < 2; t++) {
  const ten = byName[`blk.${layers[t]}.engram_embd.weight`];
  check(!!ten, `table ${t} tensor present`);
  if (!ten) continue;
  check(ten.dtype === 24, `table ${t} is I8 (type 24)`);
  check(ten.shape.length === 2 && BigInt(ten.shape[0]) === 264n && BigInt(ten.shape[1]) === rows[t], `table ${t} shape [264, rows]`);
  check(abs(ten) === BigInt(info.tables[t].offset), `table ${t} offset ${abs(ten)} = info ${info.tables[t].offset}`);
}
const t0 = byName["blk.1.engram_embd.weight"], t1 = byName["blk.14.engram_embd.weight"];
if (t0 && t1) {
  const others = tensorInfos.filter((t) => t !== t0 && t !== t1);
  const last = abs(t0) < abs(t1) && others.every((t) => tensorDataOffset + t.offset < abs(t0));
  check(last === info.placement.tables_last, "tables-last agrees with info");
  check((abs(t0) % 4096n === 0n) === info.placement.table0_page_aligned, "page alignment agrees with info");
  const size = BigInt(info.file_bytes);
  check(abs(t1) + rows[1] * 264n <= size, "table 1 inside the file");
}
if (info.projection) {
  const W = BigInt(info.width);
  for (const L of layers) {
    const kv = byName[`blk.${L}.engram_kv.weight`];
    check(kv && kv.dtype === 1 && BigInt(kv.shape[0]) === 6144n && BigInt(kv.shape[1]) === 5n * W, `engram_kv ${L} F16 [6144, 5W]`);
    for (const n of ["q_norm", "k_norm"]) {
      const x = byName[`blk.${L}.engram_${n}.weight`];
      check(x && x.dtype === 0 && BigInt(x.shape[0]) === W && BigInt(x.shape[1]) === 4n, `${n} ${L} F32 [W, 4]`);
    }
  }
}
finish();
