" The Vim half of acp_chat: the chat buffer, the permission popup, the timer that pumps.
"
" python3/acp_chat/chat.py holds the connection to the agent. Everything here runs on Vim's one
" thread, and so does every callback of the connection: Vim cannot be woken from another thread,
" so a 10 ms timer pumps what arrived, for at most 8 ms each time (chat.PUMP_BUDGET).

let s:timer = -1
let s:python_loaded = 0

function! acp_chat#start(argv) abort
  if empty(a:argv)
    echohl WarningMsg
    echomsg 'acp_chat: set g:acp_chat_agent to the agent command, e.g. ["/usr/bin/python3", "agent.py"]'
    echohl None
    return
  endif
  let l:buffer = s:open_chat()
  if !s:python_loaded
    " What is missing (msgspec, the vendored file) goes to the chat buffer, with the command that
    " installs it: an import error would be a traceback and a Press-ENTER prompt.
    py3 import acp_chat
    let l:missing = py3eval('acp_chat.missing()')
    if !empty(l:missing)
      call s:note(l:buffer, ['[error] ' . l:missing[0]] + l:missing[1:])
      return
    endif
    py3 import acp_chat.chat
    let s:python_loaded = 1
  endif
  py3 acp_chat.chat.start(vim.eval('a:argv'), int(vim.eval('l:buffer')), float(vim.eval('get(g:, "acp_chat_start_timeout", 60)')))
  if s:timer == -1
    let s:timer = timer_start(10, function('s:tick'), {'repeat': -1})
  endif
endfunction

function! acp_chat#ask(text) abort
  if s:python_loaded
    py3 acp_chat.chat.ask(vim.eval('a:text'))
  endif
endfunction

function! acp_chat#cancel() abort
  if s:python_loaded
    py3 acp_chat.chat.cancel()
  endif
endfunction

" Close the connection and stop the agent (on :AcpStop and VimLeavePre).
function! acp_chat#stop() abort
  if s:timer != -1
    call timer_stop(s:timer)
    let s:timer = -1
  endif
  if s:python_loaded
    py3 acp_chat.chat.stop()
  endif
endfunction

" The permission question: a popup menu of the options; returns its id. Called from Python.
function! acp_chat#permission(title, labels) abort
  return popup_menu(a:labels, {'title': ' ' . a:title . ' ', 'callback': function('s:answered')})
endfunction

function! s:answered(popup, choice) abort
  py3 acp_chat.chat.answered(int(vim.eval('a:popup')), int(vim.eval('a:choice')))
endfunction

function! s:tick(timer) abort
  py3 acp_chat.chat.pump()
endfunction

" The acp://chat buffer, shown in a window at the bottom; the cursor goes there.
function! s:open_chat() abort
  let l:buffer = bufadd('acp://chat')
  call setbufvar(l:buffer, '&buftype', 'nofile')
  call setbufvar(l:buffer, '&bufhidden', 'hide')
  call setbufvar(l:buffer, '&swapfile', 0)
  silent call bufload(l:buffer)
  if bufwinnr(l:buffer) == -1
    execute 'silent botright sbuffer' l:buffer
  else
    execute bufwinnr(l:buffer) . 'wincmd w'
  endif
  setlocal nomodifiable nonumber wrap filetype=acpchat
  nnoremap <buffer> <silent> C :call acp_chat#cancel()<CR>
  return l:buffer
endfunction

" A line of the plugin's own in the chat buffer (before the Python half is loaded).
function! s:note(buffer, lines) abort
  call setbufvar(a:buffer, '&modifiable', 1)
  if getbufline(a:buffer, 1, '$') == ['']
    call setbufline(a:buffer, 1, a:lines)
  else
    call appendbufline(a:buffer, '$', a:lines)
  endif
  call setbufvar(a:buffer, '&modifiable', 0)
endfunction
