// A relying party built on openid-client (an OpenID Certified library this project did not
// write), driven by e2e/tests/e2e/supervisor_rp.rs against the Selkie Supervisor:
//
//   node rp.mjs <issuer> <redirect_uri> <idp display name>
//
// It discovers the issuer, prints the authorization URL it builds (PKCE S256, state, nonce) on
// one line, reads the callback URL (with the code) from stdin, redeems the code and validates the
// ID token the library's way (signature from jwks_uri, iss, aud, exp, nonce, at_hash), then prints
// the ID token's claims as one JSON line. The issuer's CA comes from NODE_EXTRA_CA_CERTS.
//
// As a confidential web application (a dynamic OIDCClient): with RP_CLIENT_ID and
// RP_CLIENT_SECRET set it authenticates with client_secret_basic, asks for RP_SCOPE, and after
// the code also redeems the refresh token, printing the refreshed ID token's claims as
// `refreshed`; then it logs out as a web app does, revoking the new refresh token at the
// issuer's revocation_endpoint (RFC 7009), tries to refresh with it once more and prints the
// OAuth error it gets as `after_revocation`.
import * as readline from 'node:readline/promises';
import * as client from 'openid-client';

const [issuer, redirectUri, idpName] = process.argv.slice(2);
const clientId = process.env.RP_CLIENT_ID || 'pinniped-cli';
const secret = process.env.RP_CLIENT_SECRET;
const config = await client.discovery(
  new URL(issuer),
  clientId,
  { id_token_signed_response_alg: 'ES256' },
  secret ? client.ClientSecretBasic(secret) : client.None(),
);
const verifier = client.randomPKCECodeVerifier();
const state = client.randomState();
const nonce = client.randomNonce();
const url = client.buildAuthorizationUrl(config, {
  redirect_uri: redirectUri,
  scope: process.env.RP_SCOPE || 'openid offline_access username groups',
  code_challenge: await client.calculatePKCECodeChallenge(verifier),
  code_challenge_method: 'S256',
  state,
  nonce,
  pinniped_idp_name: idpName,
});
console.log(url.href);
const lines = readline.createInterface({ input: process.stdin });
const callback = await lines[Symbol.asyncIterator]().next();
lines.close();
const tokens = await client.authorizationCodeGrant(config, new URL(callback.value), {
  pkceCodeVerifier: verifier,
  expectedState: state,
  expectedNonce: nonce,
  idTokenExpected: true,
});
const result = { claims: tokens.claims(), scope: tokens.scope, token_type: tokens.token_type };
if (secret && tokens.refresh_token) {
  const refreshed = await client.refreshTokenGrant(config, tokens.refresh_token);
  result.refreshed = refreshed.claims();
  await client.tokenRevocation(config, refreshed.refresh_token);
  try {
    await client.refreshTokenGrant(config, refreshed.refresh_token);
    result.after_revocation = 'refreshed';
  } catch (error) {
    result.after_revocation = error.error ?? String(error);
  }
}
console.log(JSON.stringify(result));
