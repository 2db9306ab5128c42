// Generates images through mmgate's OpenAI-shaped HTTP API with the
// official OpenAI SDK: only the base URL changes.
//
//   node examples/openai-images.mjs "a red fox" 4      # writes image-0.png … image-3.png
//
// MMGATE_URL (default http://127.0.0.1:50051) is the server; MMGATE_AUTH_TOKEN
// is sent as the API key when the server has auth.token set. OUT_DIR (default
// the current directory) is where the images go.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";

const [prompt = "a red fox", count = "1"] = process.argv.slice(2);
const client = new OpenAI({
  baseURL: `${process.env.MMGATE_URL ?? "http://127.0.0.1:50051"}/v1`,
  // The SDK insists on a key; the server reads it only when auth is on.
  apiKey: process.env.MMGATE_AUTH_TOKEN ?? "unused",
});

const result = await client.images.generate({ prompt, n: Number(count), output_format: "png" });
for (const [index, image] of result.data.entries()) {
  const file = join(process.env.OUT_DIR ?? ".", `image-${index}.png`);
  writeFileSync(file, Buffer.from(image.b64_json, "base64"));
  console.log(file);
}
