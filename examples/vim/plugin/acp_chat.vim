" acp_chat: chat with a coding agent (Agent Client Protocol) in a Vim buffer.
"
"   let g:acp_chat_agent = ['/usr/bin/python3', '/path/to/agent.py']   " the agent to start
"   :AcpStart [command...]   start the agent (g:acp_chat_agent without arguments), open acp://chat
"   :AcpAsk {text}           send a prompt; the reply streams into acp://chat
"   :AcpCancel               cancel the running turn (C in the chat buffer)
"   :AcpStop                 stop the agent (done for you when Vim exits)
"
" Needs Vim with +python3, +popupwin and +timers, and msgspec installed for Vim's Python (:AcpStart
" says how when it is missing). g:acp_chat_start_timeout: seconds the agent gets to answer (60).

if exists('g:loaded_acp_chat') || !has('python3') || !has('popupwin') || !has('timers')
  finish
endif
let g:loaded_acp_chat = 1

command! -nargs=* AcpStart call acp_chat#start(empty([<f-args>]) ? get(g:, 'acp_chat_agent', []) : [<f-args>])
command! -nargs=+ AcpAsk call acp_chat#ask(<q-args>)
command! -nargs=0 AcpCancel call acp_chat#cancel()
command! -nargs=0 AcpStop call acp_chat#stop()

augroup acp_chat
  autocmd!
  autocmd VimLeavePre * call acp_chat#stop()
augroup END
