// Which variables the official TypeScript SDK (@modelcontextprotocol/server 2.4.0) binds for each URI,
// for the gateway's property tests: as McpServer's resources/read does, each URI is parsed with
// `new URL` and its `toString()` matched against the templates, in order, with the SDK's own
// UriTemplate (which does not decode what it binds).
//
// Reads a JSON list of URIs on stdin; prints one JSON list with, per URI, {"template": T, "vars": {...}}
// for the first template that matches, or null.
//
//     PORTCULLIS_PEERS=$PEERS node uri_match.mjs < uris.json
import { createRequire } from 'node:module';
import path from 'node:path';
import os from 'node:os';

const peers = process.env.PORTCULLIS_PEERS || path.join(os.homedir(), '.cache', 'portcullis-peers');
const require = createRequire(path.join(peers, 'npm', 'package.json'));
const { UriTemplate } = await import(require.resolve('@modelcontextprotocol/server'));

const TEMPLATES = ['logs://{service}{?level}', 'users://{user_id}', 'file:///{+path}'];

let input = '';
for await (const chunk of process.stdin) input += chunk;
const parsed = TEMPLATES.map(t => [t, new UriTemplate(t)]);
const out = JSON.parse(input).map(uri => {
    let text;
    try {
        text = new URL(uri).toString();
    } catch {
        return null;
    }
    for (const [t, template] of parsed) {
        const vars = template.match(text);
        if (vars) return { template: t, vars };
    }
    return null;
});
process.stdout.write(JSON.stringify(out));
