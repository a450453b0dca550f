-- A run's wake list (`<run hash>:wake`, in the run's slot): what `RunHandle.wait()` blocks on
-- (BLPOP) instead of polling. 'e': the run may have ended, its waiter reads it at once; 'p':
-- it moved, a progress view reads it (at most once per its interval). One element is kept,
-- for a minute: a waiter that was reading when it came finds it on its next pop.
local function wake(run_hash, ev)
  local w = run_hash .. ':wake'
  redis.call('LPUSH', w, ev)
  redis.call('LTRIM', w, 0, 0)
  redis.call('EXPIRE', w, 60)
end
