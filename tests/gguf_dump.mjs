// Independent view of a GGUF file through the npm package @huggingface/gguf
// (not this project's parser): prints JSON with the metadata, every tensor's
// name/type/shape and absolute data offset, and each key's GGUF value type
// ("types": key -> [type] or, for an array, [9, element type]), for the
// tests to check.
// Usage: node tests/gguf_dump.mjs FILE.gguf
import { open } from "./gguf_lib.mjs";

const path = process.argv[2];
const { metadata, typedMetadata, tensorInfos, tensorDataOffset } = await open(path);
const plain = (v) =>
  typeof v === "bigint" ? v.toString() : Array.isArray(v) ? v.map(plain) : v;
const out = { metadata: {}, types: {}, tensor_data_offset: tensorDataOffset.toString(), tensors: [] };
for (const [k, v] of Object.entries(metadata)) out.metadata[k] = plain(v);
for (const [k, t] of Object.entries(typedMetadata))
  out.types[k] = t.subType === undefined ? [t.type] : [t.type, t.subType];
for (const t of tensorInfos)
  out.tensors.push({
    name: t.name,
    type: t.dtype,
    shape: t.shape.map((d) => d.toString()),
    offset: (tensorDataOffset + t.offset).toString(),
  });
process.stdout.write(JSON.stringify(out) + "\n");
