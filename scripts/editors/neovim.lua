-- Drives caret lsp from Neovim's own LSP client (0.7+): completion, then caret.apply.
local caret = os.getenv('CARET_BIN')
local root = os.getenv('WS')
local file = root .. '/shapes.py'
local out = {}
local function say(s) table.insert(out, s) end
local id = vim.lsp.start_client({
  name = 'caret',
  cmd = { caret, 'lsp' },
  root_dir = root,
  init_options = { debounce_ms = 0 },
})
vim.cmd('edit ' .. file)
vim.lsp.buf_attach_client(0, id)
local ok = vim.wait(60000, function()
  local c = vim.lsp.get_client_by_id(id)
  return c ~= nil and c.initialized
end, 100)
say('initialized: ' .. tostring(ok))
local c = vim.lsp.get_client_by_id(id)
say('server: ' .. vim.inspect(c.server_capabilities.executeCommandProvider))
-- Cursor at the end of `    p = ` (line 11), as in insert mode after typing it (a normal-mode
-- cursor cannot sit past the line's last character).
local params = { textDocument = vim.lsp.util.make_text_document_params(), position = { line = 10, character = 8 } }
local t0 = vim.loop.hrtime()
local res = vim.lsp.buf_request_sync(0, 'textDocument/completion', params, 120000)
local ms = (vim.loop.hrtime() - t0) / 1e6
for _, r in pairs(res or {}) do
  if r.error then say('completion error: ' .. vim.inspect(r.error)) end
  if r.result and r.result.items and r.result.items[1] then
    say(string.format('completion (%.0f ms): %q', ms, r.result.items[1].textEdit.newText))
  end
end
-- caret.apply: the server asks Neovim to apply the edit (workspace/applyEdit).
local edit = '<<<<<<< SEARCH\n    return 2 * (w + h)\n=======\n    return 2 * w + 2 * h\n>>>>>>> REPLACE\n'
local ares = vim.lsp.buf_request_sync(0, 'workspace/executeCommand',
  { command = 'caret.apply', arguments = { { uri = vim.uri_from_fname(file), edit = edit } } }, 10000)
for _, r in pairs(ares or {}) do say('apply: ' .. vim.inspect(r.result or r.error)) end
vim.wait(2000, function() return vim.api.nvim_buf_get_lines(0, 5, 6, false)[1] == '    return 2 * w + 2 * h' end, 50)
say('buffer line 6 now: ' .. vim.api.nvim_buf_get_lines(0, 5, 6, false)[1])
vim.fn.writefile(out, os.getenv('OUT'))
vim.lsp.stop_client(id)
vim.wait(3000, function() return vim.lsp.get_client_by_id(id) == nil end, 50)
vim.cmd('qa!')
