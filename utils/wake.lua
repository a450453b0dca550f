-- A run's wake list (`<run hash>:wake`, in the run's slot: utils/keyspace.py `wake`): what
-- `RunHandle.wait()` blocks on (BLPOP) instead of polling. 'e': the run may have ended, its
-- waiter reads it at once; 'p': it moved, a progress view reads it (at most once per its
-- interval). One element is kept, for a minute: a waiter that was reading when it came finds
-- it on its next pop. Included by the ledger's scripts (`wake`: from the run hash) and the
-- outbox's acknowledgement (`wake_list`: the key it was given).
local function wake_list(w, ev)
  redis.call('LPUSH', w, ev)
  redis.call('LTRIM', w, 0, 0)
  redis.call('EXPIRE', w, 60)
end
local function wake(run_hash, ev) wake_list(run_hash .. ':wake', ev) end
