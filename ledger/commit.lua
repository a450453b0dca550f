-- Commits of one run's tasks (a batch's, or a single task's), each at most once per task id.
-- The ARGV below is built by utils/wire.py (`commit_argv`), tests/utils/test_wire.py its layout.
-- KEYS: 1 counters, 2 run hash, 3 outbox (on a cluster the run's own), 4 active runs (on a
--       cluster the counters again: the caller updates the set), 5 pending, 6 ledger (tid ->
--       message of every task sent and not yet committed, for the sweeper), 7 storing runs
--       (done runs whose items still wait in the outbox; on a cluster the counters again: the
--       caller updates the set); then with a run: 8 its done set, 9 its staged hash (shared
--       by every commit); without one, per commit: its done key, its kids list
-- ARGV: 1 run, 2 now, 3 ttl, 4 uniq key prefix, 5 number of commits n, 6 number of outbox
--       entry groups; then the n task ids; then per group: kind (m: its members' items are
--       merged, r: one entry written as it came), n_fields, fields... (an `m` group's without
--       `items`); then per commit: step, outcome, n_items, n_entries, per entry: its
--       group, the inside of its items' JSON array; n_kids, per kid: step, uniq, json;
--       n_counts, per count: step, counter, n (counted with the commit)
-- Reply: one flat array (a table a commit cost as much to convert as the rest of the reply):
-- the run's outstanding tasks (0 without a run), its hold as read here (2 cancelled, 1 paused,
-- 0 neither: the caller's begins reuse it for a second), then per commit -1 (already committed) or
-- the number m of what it staged followed by those m: the number (1-based) of each of its
-- kids staged, whose message the caller holds, and the message of each waiting child
-- released, so the caller publishes them with no read-back round trip.
-- Staged children of a run's task are recorded by id only, as `tid -> "id id ..."` in the
-- run's staged hash (one HSET a call): their messages are in the ledger already, so a
-- redelivered committed task finds them there (`RunState.staged`), and a page's message is
-- written to Redis once, not twice.
-- Counters, EXPIREs and the run's `last` are written once per call, summed over its commits
-- (the counters with one HMGET and one HSET).
-- Globals read in loops are copied to locals first: a global is a table lookup on every
-- read in Lua 5.1, a local a register.
local ARGV, KEYS, tonumber, unpack = ARGV, KEYS, tonumber, unpack
local rcall, tconcat, sfind, ssub = redis.call, table.concat, string.find, string.sub
-- The counts of a commit (items, entries, children) are mostly 0-2: a table lookup, where
-- `tonumber` parses with strtod at several times the cost.
local small = {['0'] = 0, ['1'] = 1, ['2'] = 2}
local function num(s) return small[s] or tonumber(s) end
-- A child's id: its message is `Kid.encode()`, `{"id":"<id>",...`; plain find, no pattern.
local function id_of(msg)
  if ssub(msg, 1, 7) == '{"id":"' then
    local e = sfind(msg, '"', 8, true)
    if e then return ssub(msg, 8, e - 1) end
  end
  return cjson.decode(msg)['id']
end
local run, now, ttl, uprefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local n, n_groups = tonumber(ARGV[5]), tonumber(ARGV[6])
local i = 7
local tids = {}
for c = 1, n do tids[c] = ARGV[i]; i = i + 1 end
-- Outbox entries: the caller groups a call's entries that differ only in their items (same
-- run, step, endpoint, item type, key); the fresh commits' items of a group become one entry,
-- in commit order, XADDed after the loop: a batch of pages costs the outbox one entry per item
-- type, not one a page (every entry is written, read, acknowledged and deleted by the
-- drainer). The commits of one call are of tasks that ran side by side: no order is lost.
local groups = {}
for g = 1, n_groups do
  local nf = num(ARGV[i + 1])
  groups[g] = {raw = ARGV[i] == 'r', at = i + 2, nf = nf, parts = {}, used = false}
  i = i + 2 + nf
end
local cap, cancelled, paused, compacted, watched = 0, false, false, false, false
-- `nowait` in the run hash: its waiting list (KEYS[5]) is empty. Set by a call that read the
-- list empty and left it so, dropped by whatever pushes to it (this script, park.lua, a
-- client's `enqueue_and_release`) with the push: a capped run's calls read no LLEN while
-- nothing waits (a command a call).
local nowait = false
-- The run's `last` commit time and the expiry of its done set, ledger and staged hash are
-- written at most once a second (RENEW): a run committing faster saves an HSET and three
-- EXPIREs a call. `last` is what the sweeper's stall clock and the views read (to the second
-- is enough); a commit after a re-send (`resend_mark` equal to `last`) always writes it, so
-- the sweeper sees that progress at once. The keys' expiry is the retention counted from a
-- commit at most a second older; the commit that ends the run writes them all.
local RENEW = 1
local renew = true
if run ~= '' then
  local rh = rcall('HMGET', KEYS[2], 'cap', 'cancelled', 'paused', 'compacted', 'watch', 'last',
    'resend_mark', 'nowait')
  cap, cancelled, paused = tonumber(rh[1] or '0'), rh[2] ~= false, rh[3] ~= false
  compacted = rh[4] ~= false  -- finished and its done set dropped: every task of it committed
  watched = rh[5] ~= false and tonumber(rh[5]) > tonumber(now)  -- a progress view is open
  renew = not rh[6] or tonumber(now) - (tonumber(rh[6]) or 0) >= RENEW
    or (rh[7] ~= false and rh[7] == rh[6])
  nowait = rh[8] ~= false
end
-- include: ../utils/wake.lua
local function chunked(cmd, key, list, step)  -- unpack() has a limit (the Lua C stack)
  for a = 1, #list, step do
    rcall(cmd, key, unpack(list, a, math.min(a + step - 1, #list)))
  end
end
local function write_entries()
  for _, g in ipairs(groups) do
    if g.used then
      local args = {}
      for f = g.at, g.at + g.nf - 1 do args[#args + 1] = ARGV[f] end
      if not g.raw then
        args[#args + 1] = 'items'
        args[#args + 1] = '[' .. tconcat(g.parts, ',') .. ']'
      end
      rcall('XADD', KEYS[3], '*', unpack(args))
    end
  end
end
local reply, counts, touched = {0, cancelled and 2 or paused and 1 or 0}, {}, {}
local delta, committed = 0, 0
local ledger_set, ledger_del = {}, {}  -- written with one HSET and one HDEL a call
local staged_set = {}  -- tid, its staged children's ids: one HSET of the staged hash a call
-- which task ids are fresh: one SMISMEMBER and one SADD for the whole call (each redis.call
-- costs about as much as the command it runs)
local fresh_ids = {}
if run ~= '' and not compacted and n == 1 then  -- a page alone: SADD's reply says it is fresh
  if rcall('SADD', KEYS[8], tids[1]) == 1 then
    fresh_ids[tids[1]] = true
    touched[KEYS[8]] = true
  end
elseif run ~= '' and not compacted and n > 0 then
  local member = {}
  for a = 1, #tids, 4000 do
    local part = rcall('SMISMEMBER', KEYS[8], unpack(tids, a, math.min(a + 3999, #tids)))
    for _, m in ipairs(part) do member[#member + 1] = m end
  end
  local new = {}
  for k, tid in ipairs(tids) do
    if member[k] == 0 and not fresh_ids[tid] then
      fresh_ids[tid] = true
      new[#new + 1] = tid
    end
  end
  if #new > 0 then
    chunked('SADD', KEYS[8], new, 4000)
    touched[KEYS[8]] = true
  end
end
-- The run's counters this call adds to, read once before the loop (`pre`: field -> value,
-- false for an absent field): their names follow from the ARGV and the fresh ids, a superset
-- of what the loop counts (a kid's `skipped_unique` read whether or not it is one). The same
-- HMGET reads `inflight` for the cap, where a HGET of its own cost a command a call.
local pre = nil
if run ~= '' and next(fresh_ids) ~= nil then
  local names, seen = {'outstanding', 'inflight'}, {outstanding = true, inflight = true}
  local function want(f)
    if not seen[f] then seen[f] = true; names[#names + 1] = f end
  end
  local j = i
  for c = 1, n do
    local fresh = fresh_ids[tids[c]] == true
    local step, outcome, n_items = ARGV[j], ARGV[j + 1], num(ARGV[j + 2])
    j = j + 3
    j = j + 1 + 2 * num(ARGV[j])  -- its outbox entries
    local n_kids = num(ARGV[j]); j = j + 1
    if fresh then
      want(step .. ':' .. outcome); want(outcome)
      if n_items > 0 then want(step .. ':items'); want('items') end
      for k = j, j + 3 * n_kids - 1, 3 do
        want('dispatched'); want(ARGV[k] .. ':dispatched')
        if ARGV[k + 1] ~= '' then want(ARGV[k] .. ':skipped_unique'); want('skipped_unique') end
      end
    end
    j = j + 3 * n_kids
    local n_counts = num(ARGV[j]); j = j + 1
    if fresh then
      for k = j, j + 3 * n_counts - 1, 3 do
        want(ARGV[k] .. ':' .. ARGV[k + 1]); want(ARGV[k + 1])
      end
    end
    j = j + 3 * n_counts
  end
  if #names <= 4000 then  -- else read at the end, as many as unpack() takes at once
    local got = rcall('HMGET', KEYS[1], unpack(names))
    pre = {}
    for k = 1, #names do pre[names[k]] = got[k] end
  end
end
local inflight0, inflight, waiting = nil, 0, nil  -- with a cap: tasks in the broker; pending's length
local function count(field, by) counts[field] = (counts[field] or 0) + by end
local function waits()  -- the waiting list's length: read once per call, then kept here
  if waiting == nil then waiting = nowait and 0 or rcall('LLEN', KEYS[5]) end
  return waiting
end
for c = 1, n do
  local done_key, kids_key = KEYS[8], KEYS[9]
  if run == '' then done_key, kids_key = KEYS[6 + 2 * c], KEYS[7 + 2 * c] end
  local tid, step, outcome = tids[c], ARGV[i], ARGV[i + 1]
  local n_items = num(ARGV[i + 2])
  i = i + 3
  local fresh_task
  if run == '' then
    fresh_task = rcall('SET', done_key, '1', 'NX', 'EX', ttl)
  elseif compacted then
    fresh_task = false
  else  -- every commit of a run shares its done set (KEYS[8]); the first of a tid wins
    fresh_task = fresh_ids[tid] == true
    fresh_ids[tid] = nil
  end
  local n_entries = num(ARGV[i]); i = i + 1
  for _ = 1, n_entries do
    if fresh_task then
      local g = groups[num(ARGV[i])]
      g.used = true
      if ARGV[i + 1] ~= '' then g.parts[#g.parts + 1] = ARGV[i + 1] end
    end
    i = i + 2
  end
  local n_kids = num(ARGV[i]); i = i + 1
  local kids_at = i  -- the counts after the kids are read first, then the kids
  i = i + 3 * n_kids
  local n_counts = num(ARGV[i]); i = i + 1
  if fresh_task and run ~= '' then
    for k = i, i + 3 * n_counts - 1, 3 do
      count(ARGV[k] .. ':' .. ARGV[k + 1], tonumber(ARGV[k + 2]))
      count(ARGV[k + 1], tonumber(ARGV[k + 2]))
    end
  end
  local next_commit = i + 3 * n_counts
  i = kids_at
  if not fresh_task then
    reply[#reply + 1] = -1
  else
    committed = committed + 1
    if run ~= '' then ledger_del[#ledger_del + 1] = tid end
    if cap > 0 then  -- backpressure: this task leaves the broker (`inflight` is written once, at
      if inflight0 == nil then  -- the end, as the net change)
        local v
        if pre then v = pre['inflight'] else v = rcall('HGET', KEYS[1], 'inflight') end
        inflight0 = tonumber(v or '0')
        inflight = inflight0
      end
      inflight = inflight - 1
    end
    local staged = {}  -- the reply: the staged messages (the run's outstanding count goes first)
    -- children: staged for this task to send; with a cap, to the run's waiting list when the
    -- cap is reached or others wait ahead of them (order kept), and always while it is paused
    local total = 0
    local kid_ids = {}  -- with a run: the ids of the children staged for this task to send
    if cancelled then  -- a cancelled run sends no more children (its items are kept)
      i = i + 3 * n_kids
      n_kids = 0
    end
    for kn = 1, n_kids do
      local kstep, uniq, msg = ARGV[i], ARGV[i + 1], ARGV[i + 2]; i = i + 3
      local fresh = 1
      if uniq ~= '' and run ~= '' then
        local ukey = uprefix .. kstep
        fresh = rcall('SADD', ukey, uniq)
        touched[ukey] = true
      end
      if fresh == 0 then  -- sent already in this run (a `unique` step)
        count(kstep .. ':skipped_unique', 1)
        count('skipped_unique', 1)
      end
      if fresh == 1 then
        local wait = paused or (cap > 0 and (inflight >= cap or waits() > 0))  -- run's only
        if wait then
          if waiting ~= nil then waiting = waiting + 1 end
        elseif cap > 0 then
          inflight = inflight + 1
        end
        if run == '' then  -- no ledger: the task's own kids list holds the message
          rcall('RPUSH', kids_key, msg)
          touched[kids_key] = true
          staged[#staged + 1] = kn  -- the caller has its message
        else
          local kid_id = id_of(msg)
          if wait then  -- to the run's waiting list, message and all
            rcall('RPUSH', KEYS[5], msg)
            touched[KEYS[5]] = true
          else  -- staged by id (the caller has its message; the ledger gets it below)
            staged[#staged + 1] = kn
            kid_ids[#kid_ids + 1] = kid_id
          end
          ledger_set[#ledger_set + 1] = kid_id
          ledger_set[#ledger_set + 1] = msg
          count(kstep .. ':dispatched', 1)
        end
        total = total + 1
      end
    end
    if run ~= '' then
      -- release waiting children into the freed slots, oldest first
      if cap > 0 and not paused then
        while inflight < cap and waits() > 0 do
          local m = rcall('LPOP', KEYS[5])
          if not m then waiting = 0; break end
          -- its message is in the ledger since it was queued
          kid_ids[#kid_ids + 1] = id_of(m)
          staged[#staged + 1] = m
          waiting = waiting - 1
          inflight = inflight + 1
        end
      end
      count(step .. ':' .. outcome, 1)
      count(outcome, 1)
      if n_items > 0 then
        count(step .. ':items', n_items)
        count('items', n_items)
      end
      if total > 0 then count('dispatched', total) end
      delta = delta + total - 1
      if #kid_ids > 0 then
        staged_set[#staged_set + 1] = tid
        staged_set[#staged_set + 1] = tconcat(kid_ids, ' ')
      end
    end
    reply[#reply + 1] = #staged
    for x = 1, #staged do reply[#reply + 1] = staged[x] end
  end
  i = next_commit
end
write_entries()
if #staged_set > 0 then  -- with a run every commit's staging is the run's staged hash
  chunked('HSET', KEYS[9], staged_set, 4000)
  touched[KEYS[9]] = true
end
if #ledger_del > 0 then chunked('HDEL', KEYS[6], ledger_del, 4000) end
if #ledger_set > 0 then
  chunked('HSET', KEYS[6], ledger_set, 4000)  -- even: field, message pairs stay whole
  touched[KEYS[6]] = true
end
local left = 0
if run ~= '' and committed > 0 then
  -- every counter of the call in one HMGET (`pre`, before the loop) and one HSET (a HINCRBY
  -- each cost a command a counter: 5-7 a page); the script is atomic and writes the counters
  -- only here, so the sums are what HINCRBYs would leave
  local names, bys = {'outstanding'}, {delta}
  for field, by in pairs(counts) do
    if by ~= 0 then names[#names + 1] = field; bys[#bys + 1] = by end
  end
  local cur, missing, at = {}, {}, {}
  for k = 1, #names do
    local v = pre and pre[names[k]]
    if v == nil then missing[#missing + 1] = names[k]; at[#at + 1] = k else cur[k] = v end
  end
  if #missing > 0 then  -- not read before the loop (none is, when `pre` was read)
    local got = rcall('HMGET', KEYS[1], unpack(missing))
    for x = 1, #missing do cur[at[x]] = got[x] end
  end
  local set = {}
  for k = 1, #names do
    set[#set + 1] = names[k]
    set[#set + 1] = (tonumber(cur[k] or '0') or 0) + bys[k]
  end
  left = set[2]
  if inflight0 ~= nil and inflight ~= inflight0 then  -- read by this call: its value is known
    set[#set + 1] = 'inflight'
    set[#set + 1] = inflight
  end
  rcall('HSET', KEYS[1], unpack(set))
  if left <= 0 then renew = true end  -- the run's last commit writes them all
  local mark = not nowait and waiting == 0 and not touched[KEYS[5]]  -- read empty, left so
  if renew and mark then
    rcall('HSET', KEYS[2], 'last', now, 'nowait', '1')
  elseif renew then
    rcall('HSET', KEYS[2], 'last', now)
  elseif mark then
    rcall('HSET', KEYS[2], 'nowait', '1')
  end
  if left <= 0 then
    wake(KEYS[2], 'e')  -- ended, or storing its last items (the outbox's ack wakes it again)
    rcall('HSET', KEYS[2], 'status', cancelled and 'cancelled' or 'done', 'finished', now)
    if KEYS[4] ~= KEYS[1] then rcall('SREM', KEYS[4], run) end  -- a cluster: the caller's
    rcall('DEL', KEYS[6])
    touched[KEYS[6]] = nil
    if KEYS[9] then  -- nothing is left to send
      rcall('DEL', KEYS[9])
      touched[KEYS[9]] = nil
    end
    if not cancelled then  -- shown as `storing` until the outbox has stored its last item
      local c = rcall('HMGET', KEYS[1], 'items', 'stored', 'store_failed')
      if tonumber(c[1] or '0') > tonumber(c[2] or '0') + tonumber(c[3] or '0') then
        if KEYS[7] ~= KEYS[1] then rcall('SADD', KEYS[7], run) end  -- a cluster: the caller's
      end
    end
  elseif watched then
    wake(KEYS[2], 'p')
  end
end
if run ~= '' and not renew then  -- within RENEW of the last renewal: left as they are
  touched[KEYS[6]], touched[KEYS[8]], touched[KEYS[9]] = nil, nil, nil
elseif run ~= '' and left > 0 then  -- a staged hash created within the second, touched or not
  touched[KEYS[9]] = true
end
if nowait and touched[KEYS[5]] then rcall('HDEL', KEYS[2], 'nowait') end  -- it waits now
for key in pairs(touched) do rcall('EXPIRE', key, ttl) end
reply[1] = left
return reply
