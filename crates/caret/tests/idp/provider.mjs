// A real OpenID Connect provider for the sign-in tests: oidc-provider (OpenID Certified) with
// the tests' client, accounts and signing keys, and a plain login form in place of a product's
// pages. Started by the tests:
//
//   node provider.mjs   (environment: IDP_PORT, IDP_DIR, IDP_CLIENT_ID, IDP_CLIENT_SECRET,
//                        IDP_REDIRECT_URIS (comma-separated), IDP_ACCOUNTS (JSON: login → claims),
//                        IDP_ROTATE=1 to sign with a new key, the old one still published,
//                        IDP_DEBUG=1 to log every request on stderr)
//
// Keys live in $IDP_DIR/keys.json so that a restart keeps them (or rotates them). It prints
// "listening <issuer>" once it serves.
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import Provider from "oidc-provider";

const env = (name, fallback) => process.env[name] ?? fallback;
const port = Number(env("IDP_PORT", "0"));
const dir = env("IDP_DIR", ".");
const accounts = JSON.parse(env("IDP_ACCOUNTS", "{}"));

function newKey() {
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  return { ...privateKey.export({ format: "jwk" }), kid: randomUUID(), use: "sig", alg: "RS256" };
}

const keysFile = join(dir, "keys.json");
let keys = existsSync(keysFile) ? JSON.parse(readFileSync(keysFile, "utf8")) : [];
if (keys.length === 0 || env("IDP_ROTATE", "") === "1") keys = [newKey(), ...keys];
writeFileSync(keysFile, JSON.stringify(keys));

const server = createServer();
await new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: env("IDP_CLIENT_ID", "caret"),
      client_secret: env("IDP_CLIENT_SECRET", "caret-secret"),
      redirect_uris: env("IDP_REDIRECT_URIS", "").split(",").filter(Boolean),
      grant_types: ["authorization_code"],
      response_types: ["code"],
    },
  ],
  jwks: { keys },
  cookies: { keys: ["caret-test-cookie-key"] },
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["name"],
    groups: ["groups"],
  },
  scopes: ["openid", "email", "profile", "groups"],
  pkce: { required: () => true },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    const claims = accounts[sub];
    if (!claims) return undefined;
    return { accountId: sub, claims: async () => ({ sub, email_verified: true, ...claims }) };
  },
});

const page = (title, body) =>
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${title}</title></head><body>${body}</body></html>`;

async function readForm(req) {
  let body = "";
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

// The login form, and consent given for what the client asked.
async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { uid, prompt, params, session } = details;
  if (req.method === "POST") {
    const form = await readForm(req);
    const login = form.get("login") ?? "";
    if (!accounts[login]) {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(page("Sign in", `<p id="error">unknown account</p>`));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === "login") {
    res.writeHead(200, { "content-type": "text/html" });
    res.end(
      page(
        "Sign in",
        `<form method="post" action="/interaction/${uid}"><input name="login" id="login" autofocus>` +
          `<input name="password" id="password" type="password"><button id="go" type="submit">Sign in</button></form>`,
      ),
    );
    return;
  }
  const grant = new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  grant.addOIDCScope(String(params.scope));
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

const callback = provider.callback();
server.on("request", (req, res) => {
  if (process.env.IDP_DEBUG) console.error(req.method, req.url, req.headers.cookie ?? "");
  if (req.url.startsWith("/interaction/")) {
    interaction(req, res).catch((e) => {
      res.writeHead(500);
      res.end(String(e));
    });
  } else {
    callback(req, res);
  }
});
console.log(`listening ${issuer}`);
