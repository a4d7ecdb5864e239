// The zoo's Node drivers (tests/compat/zoo): `node zoo.mjs JOBS.json` runs each job, a scenario made by
// tests/compat/zoo/model.py, with openai-node (messages kept by hand, or the runTools helper) or the Vercel
// AI SDK (@ai-sdk/deepseek, @ai-sdk/openai-compatible), and prints the outcomes as one JSON line.
import dns from "node:dns";
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { createDeepSeek } from "@ai-sdk/deepseek";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { z } from "zod";

// Nothing may be fetched from outside this machine: name lookups beyond loopback fail and are reported
// (fetch and node:http both resolve through dns.lookup).
const tried = [];
const lookup = dns.lookup;
dns.lookup = function (hostname, options, callback) {
  if (["127.0.0.1", "localhost", "::1"].includes(hostname)) return lookup.call(this, hostname, options, callback);
  tried.push(hostname);
  const error = Object.assign(new Error(`zoo: no network beyond this machine (${hostname})`), { code: "ENOTFOUND" });
  process.nextTick(typeof options === "function" ? options : callback, error);
};

const searchForecast = ({ q }) => `forecast for ${q}: light rain`;

function openaiClient(job) {
  return new OpenAI({ baseURL: job.base_url, apiKey: job.api_key, maxRetries: 0, timeout: 10_000 });
}

// openai-node passes unknown parameters through to the body: that is how `thinking` gets there.
const extra = (job) => (job.thinking ? {} : job.no_thinking);

async function openaiNode(job) {
  const client = openaiClient(job);
  const messages = [{ role: "user", content: job.prompt }];
  for (;;) {
    const params = { model: job.model, messages, tools: [job.tool], ...extra(job) };
    let message;
    if (job.stream) {
      message = { role: "assistant", content: null };
      const calls = [];
      for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
        const delta = chunk.choices[0]?.delta;
        if (!delta) continue;
        if (delta.content) message.content = (message.content ?? "") + delta.content;
        if (delta.reasoning_content != null) {
          message.reasoning_content = (message.reasoning_content ?? "") + delta.reasoning_content;
        }
        for (const call of delta.tool_calls ?? []) {
          calls[call.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
          const entry = calls[call.index];
          entry.id = call.id ?? entry.id;
          entry.function.name += call.function?.name ?? "";
          entry.function.arguments += call.function?.arguments ?? "";
        }
      }
      if (calls.length) message.tool_calls = calls;
    } else {
      // The SDK keeps unknown fields, so the assistant turn goes back with its reasoning_content.
      message = (await client.chat.completions.create(params)).choices[0].message;
    }
    if (!message.tool_calls?.length) return { text: message.content };
    messages.push(message);
    for (const call of message.tool_calls) {
      messages.push({ role: "tool", tool_call_id: call.id, content: searchForecast(JSON.parse(call.function.arguments)) });
    }
  }
}

async function openaiNodeRunTools(job) {
  const client = openaiClient(job);
  const runner = client.beta.chat.completions.runTools({
    model: job.model,
    messages: [{ role: "user", content: job.prompt }],
    tools: [{ type: "function", function: { ...job.tool.function, function: searchForecast, parse: JSON.parse } }],
    stream: job.stream,
    ...extra(job),
  });
  return { text: await runner.finalContent() };
}

async function vercel(job, compatible) {
  const provider = compatible
    ? createOpenAICompatible({ name: "deepseek", baseURL: job.base_url, apiKey: job.api_key })
    : createDeepSeek({ baseURL: job.base_url, apiKey: job.api_key });
  const args = {
    model: provider(job.model),
    prompt: job.prompt,
    tools: {
      [job.tool.function.name]: tool({
        description: job.tool.function.description,
        inputSchema: z.object({ q: z.string() }),
        execute: async (input) => searchForecast(input),
      }),
    },
    stopWhen: stepCountIs(5),
    maxRetries: 0,
    // @ai-sdk/openai-compatible puts providerOptions[name] into the body as is; @ai-sdk/deepseek knows it.
    providerOptions: job.thinking ? undefined : { deepseek: job.no_thinking },
  };
  if (!job.stream) return { text: (await generateText(args)).text };
  let failure = null;
  const result = streamText({ ...args, onError: ({ error }) => { failure ??= error; } });
  let text = null;
  try {
    text = await result.text;
  } catch (err) {
    failure ??= err;
  }
  if (failure) throw failure;
  return { text };
}

const DRIVERS = {
  "openai-node": openaiNode,
  "openai-node-runtools": openaiNodeRunTools,
  "vercel-ai-deepseek": (job) => vercel(job, false),
  "vercel-ai-openai-compatible": (job) => vercel(job, true),
};

function describe(err) {
  const status = err.status ?? err.statusCode ?? err.lastError?.statusCode ?? err.cause?.statusCode ?? null;
  return { status, error: `${err.constructor?.name}: ${err.message}`.slice(0, 4000) };
}

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = [];
for (const job of jobs) {
  let outcome;
  try {
    outcome = await DRIVERS[job.client](job);
  } catch (err) {
    outcome = describe(err);
  }
  results.push({ id: job.id, target: job.target, ...outcome });
}
console.log(JSON.stringify({ results, network: tried }));
