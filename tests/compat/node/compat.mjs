// openai-node through a real chatgate: tool loop (reasoning_content passed back), a streamed answer and a
// broken history. Prints one JSON object on stdout for tests/compat/test_openai_node.py to check.
import OpenAI from "openai";

const baseURL = process.env.CHATGATE_BASE_URL;
const apiKey = process.env.CHATGATE_CLIENT_KEY;
const model = process.env.CHATGATE_MODEL || "deepseek-flash";
if (!baseURL || !apiKey) {
  console.error("set CHATGATE_BASE_URL and CHATGATE_CLIENT_KEY");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 10_000 });
const tools = [{
  type: "function",
  function: {
    name: "search_forecast",
    description: "Search the weather forecast.",
    parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] },
  },
}];
const searchForecast = ({ q }) => `forecast for ${q}: light rain`;
const question = { role: "user", content: "Do I need an umbrella in Lisbon today?" };

async function toolLoop() {
  const messages = [question];
  const first = await client.chat.completions.create({ model, messages, tools });
  const msg = first.choices[0].message;
  // openai-node keeps unknown fields, so the assistant turn goes back with its reasoning_content (R17).
  messages.push(msg);
  for (const call of msg.tool_calls) {
    messages.push({ role: "tool", tool_call_id: call.id, content: searchForecast(JSON.parse(call.function.arguments)) });
  }
  const final = await client.chat.completions.create({ model, messages, tools });
  return {
    first_finish_reason: first.choices[0].finish_reason,
    tool_name: msg.tool_calls[0].function.name,
    reasoning_content: msg.reasoning_content ?? null,
    final_finish_reason: final.choices[0].finish_reason,
    final_text: final.choices[0].message.content,
  };
}

async function streamed() {
  const stream = await client.chat.completions.create({
    model, messages: [question], stream: true, stream_options: { include_usage: true },
  });
  let chunks = 0, text = "", reasoning = "", usage = null;
  for await (const chunk of stream) {
    chunks += 1;
    const delta = chunk.choices[0]?.delta;
    if (delta?.content) text += delta.content;
    if (delta?.reasoning_content) reasoning += delta.reasoning_content;
    if (chunk.usage) usage = chunk.usage;
  }
  return { chunks, text, reasoning, completion_tokens: usage?.completion_tokens ?? null };
}

async function broken() {
  const messages = [
    question,
    { role: "assistant", content: null, tool_calls: [
      { id: "call_0", type: "function", function: { name: "search_forecast", arguments: '{"q": "x"}' } }] },
    { role: "tool", tool_call_id: "call_0", content: "18C" },
  ];
  try {
    await client.chat.completions.create({ model, messages, tools });
    return { raised: false };
  } catch (err) {
    return {
      raised: true,
      class_name: err.constructor.name,
      is_bad_request: err instanceof OpenAI.BadRequestError,
      is_api_error: err instanceof OpenAI.APIError,
      status: err.status,
      code: err.code ?? null,
      rule: err.error?.problems?.[0]?.rule ?? null,
      param: err.error?.problems?.[0]?.param ?? null,
    };
  }
}

const result = { tool_loop: await toolLoop(), stream: await streamed(), broken: await broken() };
console.log(JSON.stringify(result));
