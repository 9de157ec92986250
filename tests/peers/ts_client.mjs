// MCP client driver built on the official TypeScript SDK v2 (@modelcontextprotocol/client 2.4.0),
// for gateway tests.
//
//   PORTCULLIS_PEERS=... node ts_client.mjs URL [--mode legacy|2026-07-28] [--key KEY] --ops JSON
//
// --key KEY sends `Authorization: Bearer KEY` on every HTTP request (requestInit.headers).
// --ops is a JSON array of
//   {"op":"list"}                                   -> {"tools":[names]}
//   {"op":"call","name":N,"args":{..}[,"progress":true]}
//       -> {"isError":b,"text":s,"structured":v|null,"meta":v|null[,"progress":[values]]}
// --elicit approve|decline declares the elicitation capability (form) and answers every
// elicitation with accept {"approve": true} (a gateway approval question's yes) or decline;
// without it the client declares no elicitation.
// An error on one op gives {"error":message,"code":jsonrpc code|null[,"http":status]} and the next
// op runs. Prints one JSON line (the array of results); exits 1 only when connecting fails.
import { homedir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const peers = process.env.PORTCULLIS_PEERS || join(homedir(), '.cache', 'portcullis-peers');
const { Client, StreamableHTTPClientTransport, ProtocolError, SdkHttpError } = await import(
  pathToFileURL(join(peers, 'npm', 'node_modules', '@modelcontextprotocol', 'client', 'dist', 'index.mjs')).href
);

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    mode: { type: 'string', default: 'legacy' },
    key: { type: 'string' },
    ops: { type: 'string', default: '[{"op":"list"}]' },
    elicit: { type: 'string' }
  }
});
if (positionals.length !== 1 || !['legacy', '2026-07-28'].includes(opts.mode)) {
  process.stderr.write('usage: ts_client.mjs URL [--mode legacy|2026-07-28] [--key KEY] --ops JSON\n');
  process.exit(2);
}
const ops = JSON.parse(opts.ops);

function describe(err) {
  if (ProtocolError.isInstance(err)) return { error: err.message, code: err.code };
  if (SdkHttpError.isInstance(err)) return { error: err.message, code: null, http: err.status };
  return { error: String(err?.message ?? err), code: null };
}

async function runOp(client, op) {
  if (op.op === 'list') {
    const { tools } = await client.listTools();
    return { tools: tools.map((t) => t.name) };
  }
  if (op.op === 'call') {
    const seen = [];
    const options = op.progress ? { onprogress: (p) => seen.push(p.progress) } : undefined;
    const result = await client.callTool({ name: op.name, arguments: op.args ?? {} }, options);
    const out = {
      isError: Boolean(result.isError),
      text: (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n'),
      structured: result.structuredContent ?? null,
      meta: result._meta ?? null
    };
    if (op.progress) out.progress = seen;
    return out;
  }
  return { error: `unknown op ${JSON.stringify(op.op)}`, code: null };
}

const transport = new StreamableHTTPClientTransport(new URL(positionals[0]), {
  requestInit: opts.key ? { headers: { Authorization: `Bearer ${opts.key}` } } : undefined
});
const client = new Client(
  { name: 'portcullis-ts-client', version: '1.0.0' },
  {
    versionNegotiation: { mode: opts.mode === 'legacy' ? 'legacy' : { pin: opts.mode } },
    ...(opts.elicit ? { capabilities: { elicitation: { form: {} } } } : {})
  }
);
if (opts.elicit) {
  client.setRequestHandler('elicitation/create', async () =>
    opts.elicit === 'approve' ? { action: 'accept', content: { approve: true } } : { action: 'decline' }
  );
}
try {
  await client.connect(transport);
} catch (err) {
  process.stderr.write(`connect failed: ${JSON.stringify(describe(err))}\n`);
  process.exit(1);
}
const results = [];
for (const op of ops) {
  try {
    results.push(await runOp(client, op));
  } catch (err) {
    results.push(describe(err));
  }
}
process.stdout.write(JSON.stringify(results) + '\n');
await client.close().catch(() => {});
process.exit(0);
