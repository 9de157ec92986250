// A real OAuth 2.0 authorization server for the upstream-identity tests: panva's oidc-provider
// (npm, an OpenID Certified implementation), with the RFC 8693 token-exchange grant registered.
//
//   node authz_server.mjs --port 0 [--gateway-key PEM_FILE]
//
// Prints `LISTENING <port>` once ready; the issuer is http://127.0.0.1:<port>, its key set at
// /jwks, its token endpoint at /token. Clients (client_secret_basic unless said):
//   alice, bob       client_credentials; their JWT access tokens (sub = client id) are what they
//                    sign in to the gateway with (resource = the gateway's audience)
//   carol            the same, with tokens that live 3 seconds
//   portcullis       the gateway: token exchange and client_credentials
//   portcullis-post  the gateway with client_secret_post
//   portcullis-pkjwt the gateway with private_key_jwt, its public key read from --gateway-key
// Every secret is "<client id>-secret". Resource servers are any URL asked for (RFC 8707):
// tokens for them are ES256 JWTs whose `aud` is that URL.
//
// The token-exchange handler verifies the subject token (a JWT this server issued, unexpired,
// not revoked), and issues an access token for the requested resource with `sub` the subject's
// and `act` = {"sub": <the exchanging client>}. oidc-provider keeps no record of JWT access
// tokens (its revocation endpoint refuses them), so revocation of a subject token is a route of
// this script: POST /test/revoke with `jti`. GET /test/log lists the exchanges and grants served.

import http from 'node:http';
import { createPublicKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// Installed by tests/peers/setup.sh into $PORTCULLIS_PEERS/authz.
const peers = process.env.PORTCULLIS_PEERS || join(homedir(), '.cache', 'portcullis-peers');
const load = (pkg, file) => import(pathToFileURL(join(peers, 'authz', 'node_modules', pkg, file)).href);
const { default: Provider, errors } = await load('oidc-provider', 'lib/index.js');
const { calculateJwkThumbprint, createLocalJWKSet, exportJWK, generateKeyPair, jwtVerify } = await load(
  'jose',
  'dist/webapi/index.js',
);

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const JWT_TYPE = 'urn:ietf:params:oauth:token-type:jwt';

const args = process.argv.slice(2);
const arg = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};

const server = http.createServer();
await new Promise((resolve) => server.listen(Number(arg('--port') ?? 0), '127.0.0.1', resolve));
const { port } = server.address();
const issuer = `http://127.0.0.1:${port}`;

const { privateKey } = await generateKeyPair('ES256', { extractable: true });
const signing = { ...(await exportJWK(privateKey)), alg: 'ES256', use: 'sig' };
signing.kid = await calculateJwkThumbprint(signing);
const { d, ...publicJwk } = signing;
const publicKeys = createLocalJWKSet({ keys: [publicJwk] });

const secretClient = (id, grants) => ({
  client_id: id,
  client_secret: `${id}-secret`,
  grant_types: grants,
  response_types: [],
  redirect_uris: [],
  token_endpoint_auth_method: 'client_secret_basic',
});
const clients = [
  secretClient('alice', ['client_credentials']),
  secretClient('bob', ['client_credentials']),
  secretClient('carol', ['client_credentials']),
  secretClient('portcullis', [TOKEN_EXCHANGE, 'client_credentials']),
  { ...secretClient('portcullis-post', [TOKEN_EXCHANGE, 'client_credentials']), token_endpoint_auth_method: 'client_secret_post' },
];
const gatewayKey = arg('--gateway-key');
if (gatewayKey) {
  const jwk = createPublicKey(readFileSync(gatewayKey, 'utf8')).export({ format: 'jwk' });
  jwk.kid = await calculateJwkThumbprint(jwk);
  clients.push({
    client_id: 'portcullis-pkjwt',
    grant_types: [TOKEN_EXCHANGE, 'client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'private_key_jwt',
    token_endpoint_auth_signing_alg: jwk.crv === 'Ed25519' ? 'EdDSA' : 'ES256',
    jwks: { keys: [jwk] },
  });
}

// Tokens this handler issued on behalf of someone: their `act` claim.
const acting = new WeakMap();
const revoked = new Set();
const log = [];

const resourceServer = (resource, client) => ({
  audience: resource,
  scope: 'mcp:tools files:read files:write',
  accessTokenFormat: 'jwt',
  accessTokenTTL: client.clientId === 'carol' ? 3 : 600,
  jwt: { sign: { alg: 'ES256' } },
  identifier: () => resource,
});

const provider = new Provider(issuer, {
  clients,
  jwks: { keys: [signing] },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource, client) => resourceServer(resource, client),
    },
  },
  clientDefaults: { id_token_signed_response_alg: 'ES256' },
  extraTokenClaims: (ctx, token) => acting.get(token),
  clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'private_key_jwt'],
  enabledJWA: { clientAuthSigningAlgValues: ['EdDSA', 'ES256', 'RS256'] },
});
provider.on('grant.success', (ctx) => {
  if (ctx.oidc.params?.grant_type === 'client_credentials') {
    log.push({ grant: 'client_credentials', client: ctx.oidc.client.clientId, resource: ctx.oidc.params.resource ?? null });
  }
});

async function tokenExchange(ctx) {
  const { params, client } = ctx.oidc;
  if (![ACCESS_TOKEN, JWT_TYPE].includes(params.subject_token_type)) {
    throw new errors.InvalidRequest('unsupported subject_token_type');
  }
  let subject;
  try {
    ({ payload: subject } = await jwtVerify(params.subject_token, publicKeys, { issuer }));
  } catch {
    log.push({ grant: 'token-exchange', client: client.clientId, refused: 'invalid subject token' });
    throw new errors.InvalidGrant('the subject token is invalid or expired');
  }
  if (revoked.has(subject.jti)) {
    log.push({ grant: 'token-exchange', client: client.clientId, subject: subject.sub, refused: 'revoked' });
    throw new errors.InvalidGrant('the subject token was revoked');
  }
  const resource = params.resource;
  if (typeof resource !== 'string') {
    throw new errors.InvalidTarget('exactly one resource is required');
  }
  const token = new provider.AccessToken({
    accountId: subject.sub,
    client,
    scope: params.scope || undefined,
    gty: 'token-exchange',
  });
  token.resourceServer = resourceServer(resource, client);
  acting.set(token, { act: { sub: client.clientId } });
  ctx.oidc.entity('AccessToken', token);
  const value = await token.save();
  log.push({ grant: 'token-exchange', client: client.clientId, subject: subject.sub, resource, scope: params.scope ?? null });
  ctx.body = {
    access_token: value,
    issued_token_type: ACCESS_TOKEN,
    token_type: 'Bearer',
    expires_in: token.expiration,
    ...(token.scope ? { scope: token.scope } : {}),
  };
}
provider.registerGrantType(
  TOKEN_EXCHANGE,
  tokenExchange,
  ['subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'audience', 'scope', 'actor_token', 'actor_token_type'],
  ['resource'],
);

const callback = provider.callback();
server.on('request', (req, res) => {
  if (req.url === '/test/log' && req.method === 'GET') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(log));
    return;
  }
  if (req.url === '/test/revoke' && req.method === 'POST') {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      revoked.add(new URLSearchParams(body).get('jti'));
      res.writeHead(204);
      res.end();
    });
    return;
  }
  callback(req, res);
});

console.log(`LISTENING ${port}`);
