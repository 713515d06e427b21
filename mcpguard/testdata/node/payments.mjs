// The payments MCP server of mcpguard's upstream matrix, written with the
// official TypeScript MCP SDK (npm: @modelcontextprotocol/sdk; SDK=previous
// takes the previous release, installed under the alias mcp-sdk-previous).
//
// refund appends one line to the ledger file (MCP_TEST_LEDGER) every time
// it runs and never deduplicates: the ledger is the truth of how often it
// ran. It declares an output schema and answers structured content.
//
// usage: node payments.mjs stdio | node payments.mjs http PORT
import { appendFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { z } from 'zod';

const pkg = process.env.SDK === 'previous' ? 'mcp-sdk-previous' : '@modelcontextprotocol/sdk';
const { McpServer } = await import(`${pkg}/server/mcp.js`);
const { StdioServerTransport } = await import(`${pkg}/server/stdio.js`);
const { StreamableHTTPServerTransport } = await import(`${pkg}/server/streamableHttp.js`);

const ledger = process.env.MCP_TEST_LEDGER;

function lines() {
  try {
    return readFileSync(ledger, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    throw e;
  }
}

function newServer() {
  const server = new McpServer({ name: 'payments', version: '1' });
  server.registerTool('refund', {
    description: 'Refunds an order. Cannot be undone.',
    inputSchema: {
      case_id: z.string(), order_id: z.string(), amount_cents: z.number().int(), reference: z.string(),
      pad: z.number().int().optional(),
    },
    outputSchema: { ledger_id: z.number().int(), order_id: z.string(), amount_cents: z.number().int(), note: z.string() },
  }, async ({ order_id, amount_cents, reference, pad }) => {
    if (reference === 'card-declined') {
      return { isError: true, content: [{ type: 'text', text: 'card declined' }] };
    }
    // One write per line with O_APPEND: concurrent runs never interleave.
    appendFileSync(ledger, JSON.stringify({ order_id, amount_cents, reference }) + '\n');
    const out = { ledger_id: lines().length, order_id, amount_cents, note: '\u00e9'.repeat((pad ?? 0) / 2) };
    return {
      content: [{ type: 'text', text: `Refunded ${amount_cents} cents on order ${order_id}.\nLedger entry ${out.ledger_id}.` }],
      structuredContent: out,
    };
  });
  server.registerTool('balance', {
    description: 'Counts the refunds of an order.',
    inputSchema: { order_id: z.string() },
  }, async ({ order_id }) => ({
    content: [{ type: 'text', text: String(lines().filter((l) => l.order_id === order_id).length) }],
  }));
  return server;
}

if (process.argv[2] === 'stdio') {
  await newServer().connect(new StdioServerTransport());
} else {
  // Stateless streamable HTTP, as the SDK's own example serves it: a server
  // and a transport per request.
  createServer(async (req, res) => {
    if (req.method !== 'POST') {
      res.writeHead(405).end();
      return;
    }
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    const server = newServer();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on('close', () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  }).listen(Number(process.argv[3]), '127.0.0.1');
}
