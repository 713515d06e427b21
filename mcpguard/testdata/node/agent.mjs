// An agent written with the official TypeScript MCP SDK's client (npm:
// @modelcontextprotocol/sdk; SDK=previous takes the previous release),
// calling mandate-mcp over streamable HTTP. It lists the tools first, as
// agents do, so the client checks every answer of a tool that declares an
// output schema (structured content required unless isError, and valid).
//
// usage: node agent.mjs URL CALLS
// CALLS is a JSON array of {"name", "arguments", "meta"}; it prints a JSON
// array with, per call, {"ok": true, "result": ...} or {"ok": false,
// "code": ..., "message": ...} (what the client threw).
const pkg = process.env.SDK === 'previous' ? 'mcp-sdk-previous' : '@modelcontextprotocol/sdk';
const { Client } = await import(`${pkg}/client/index.js`);
const { StreamableHTTPClientTransport } = await import(`${pkg}/client/streamableHttp.js`);

const [url, calls] = process.argv.slice(2);
const client = new Client({ name: 'ts-agent', version: '1' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
await client.listTools();
const out = [];
for (const c of JSON.parse(calls)) {
  try {
    const params = { name: c.name, arguments: c.arguments };
    if (c.meta) params._meta = c.meta;
    out.push({ ok: true, result: await client.callTool(params) });
  } catch (e) {
    out.push({ ok: false, code: e.code ?? null, message: String(e.message ?? e) });
  }
}
await client.close();
process.stdout.write(JSON.stringify(out));
