"""The Lua scripts that change cluster state: each one atomic, fenced, audited.

Every script that acts for a diagnosis first checks the claim's fence (a worker that lost
its claim writes nothing), compares what it changes against what the caller saw (object
epochs), and appends to the audit stream in the same step. Node hashes are reached by
prefix + id: fine on one Redis (or Sentinel); on Redis Cluster use a ``{hash-tag}`` prefix.
"""

from __future__ import annotations

PRELUDE = r"""
local function newer(a, b)
  if not b then return true end
  if #a ~= #b then return #a > #b end
  return a > b
end
local function fenced(claim, fence)
  return fence ~= '' and redis.call('HGET', claim, 'fence') ~= fence
end
local function rate_full(key, now, window, limit)
  if limit <= 0 then return false end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%d', now - window))
  return redis.call('ZCARD', key) >= limit
end
local function rate_take(key, now, window, limit, member)
  if limit <= 0 then return end
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, window)
end
local function audit(stream, fields)
  redis.call('XADD', stream, 'MAXLEN', '~', '100000', '*', unpack(fields))
end
local function split(text)
  local set = {}
  for item in string.gmatch(text or '', '[^,]+') do set[item] = true end
  return set
end
local function shares(a, b)
  for item in pairs(a) do if b[item] then return true end end
  return false
end
"""

# KEYS: claim. ARGV: owner, now_ms, lease_ms, ttl_s.
# -> {'done'} | {'busy', lease_until_ms} | {'claimed', fence}
CLAIM = r"""
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' then return {'done'} end
if status == 'claimed' then
  local owner = redis.call('HGET', KEYS[1], 'owner')
  local lease = redis.call('HGET', KEYS[1], 'lease_ms')
  if owner ~= ARGV[1] and tonumber(lease) > tonumber(ARGV[2]) then return {'busy', lease} end
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'status', 'claimed', 'owner', ARGV[1],
  'lease_ms', string.format('%d', tonumber(ARGV[2]) + tonumber(ARGV[3])))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'claimed', tostring(fence)}
"""

# KEYS: claim. ARGV: fence, now_ms, lease_ms. -> 1 renewed | 0 fenced
RENEW = r"""
if fenced(KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'lease_ms',
  string.format('%d', tonumber(ARGV[2]) + tonumber(ARGV[3])))
return 1
"""

# KEYS: claim. ARGV: fence, field, value. -> 1 written | 0 fenced
RECORD = r"""
if fenced(KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""

# KEYS: claim. ARGV: fence, ttl_s. -> 1 done | 0 fenced
FINISH = r"""
if fenced(KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'status', 'done')
redis.call('HDEL', KEYS[1], 'lease_ms')
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: object, claim, audit, rate_job, rate_cluster, spares.
# ARGV: 1 fence, 2 expected epoch ('' any), 3 new state, 4 allowed from-states (csv, '' any),
#   5 reason, 6 diagnosis, 7 ts_ns, 8 now_ms, 9 actor, 10 action, 11 rate member ('' none),
#   12 job limit, 13 cluster limit, 14 window_ms, 15 '1': only when set by this diagnosis,
#   16 target id, 17 kind.
# -> {'ok', epoch} | {'same', epoch} | {'unknown'} | {'fenced'} | {'stale', epoch}
#    | {'refused', state, diagnosis} | {'rate_limited', 'job'|'cluster'}
TRANSITION = r"""
if fenced(KEYS[2], ARGV[1]) then return {'fenced'} end
local cur = redis.call('HMGET', KEYS[1], 'state', 'epoch', 'diagnosis')
if not cur[2] then return {'unknown'} end
local state, epoch, diag = cur[1], cur[2], cur[3] or ''
if state == ARGV[3] and (diag == ARGV[6] or ARGV[6] == '') then return {'same', epoch} end
if ARGV[15] == '1' and diag ~= ARGV[6] then return {'refused', state, diag} end
if ARGV[4] ~= '' and not split(ARGV[4])[state] then return {'refused', state, diag} end
if ARGV[2] ~= '' and ARGV[2] ~= epoch then return {'stale', epoch} end
local now = tonumber(ARGV[8])
if ARGV[11] ~= '' then
  local window = tonumber(ARGV[14])
  if rate_full(KEYS[4], now, window, tonumber(ARGV[12])) then return {'rate_limited', 'job'} end
  if rate_full(KEYS[5], now, window, tonumber(ARGV[13])) then
    return {'rate_limited', 'cluster'}
  end
  rate_take(KEYS[4], now, window, tonumber(ARGV[12]), ARGV[11])
  rate_take(KEYS[5], now, window, tonumber(ARGV[13]), ARGV[11])
end
local new_epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'reason', ARGV[5], 'diagnosis', ARGV[6],
  'ts_ns', ARGV[7])
if ARGV[17] == 'node' then
  if ARGV[3] == 'spare' then redis.call('SADD', KEYS[6], ARGV[16])
  else redis.call('SREM', KEYS[6], ARGV[16]) end
end
audit(KEYS[3], {'ts_ns', ARGV[7], 'action', ARGV[10], 'kind', ARGV[17], 'target', ARGV[16],
  'from', state, 'to', ARGV[3], 'epoch', tostring(new_epoch), 'diagnosis', ARGV[6],
  'reason', ARGV[5], 'actor', ARGV[9]})
return {'ok', tostring(new_epoch)}
"""

# KEYS: claim, job, job ranks, spares, audit, rate_job, rate_cluster.
# ARGV: 1 fence, 2 claim field of the allocation, 3 key prefix, 4 nodes to replace (csv),
#   5 max restarts, 6 ts_ns, 7 now_ms, 8 diagnosis, 9 actor, 10 job limit, 11 cluster limit,
#   12 window_ms, 13 rate member, 14 job id.
# -> {'ok', record} | {'exists', record} | {'fenced'} | {'unknown_job'} | {'stopped'}
#    | {'restart_limit', restarts} | {'not_in_job'} | {'no_spare', node, pool size}
#    | {'rate_limited', 'job'|'cluster'}
# The allocation record goes into the claim in the same step: a worker killed right after
# finds it there and resumes (publication, launcher) without allocating again.
ALLOCATE = r"""
if fenced(KEYS[1], ARGV[1]) then return {'fenced'} end
local existing = redis.call('HGET', KEYS[1], ARGV[2])
if existing then return {'exists', existing} end
local job = redis.call('HMGET', KEYS[2], 'state', 'restarts')
if not job[1] then return {'unknown_job'} end
if job[1] == 'stopped' then return {'stopped'} end
local restarts = tonumber(job[2] or '0')
if restarts >= tonumber(ARGV[5]) then return {'restart_limit', tostring(restarts)} end
local ranks = redis.call('HGETALL', KEYS[3])
local used = {}
for i = 2, #ranks, 2 do used[string.match(ranks[i], '^([^|]*)')] = true end
local failed = {}
for node in string.gmatch(ARGV[4], '[^,]+') do
  if used[node] then table.insert(failed, node) end
end
if #failed == 0 then return {'not_in_job'} end
local pool = redis.call('SMEMBERS', KEYS[4])
table.sort(pool)
local taken, chosen = {}, {}
for _, old in ipairs(failed) do
  local info = redis.call('HMGET', ARGV[3] .. ':node:' .. old, 'leaves', 'planes')
  local leaves, planes = split(info[1]), split(info[2])
  local best, best_tier = nil, 99
  for _, candidate in ipairs(pool) do
    if not taken[candidate] and not used[candidate] then
      local c = redis.call('HMGET', ARGV[3] .. ':node:' .. candidate, 'leaves', 'planes', 'state')
      if c[3] == 'spare' then
        local tier = 2
        if shares(leaves, split(c[1])) then tier = 0
        elseif shares(planes, split(c[2])) then tier = 1 end
        if tier < best_tier then best, best_tier = candidate, tier end
      end
    end
  end
  if not best then return {'no_spare', old, tostring(#pool)} end
  taken[best] = true
  table.insert(chosen, {old, best, best_tier})
end
local now, window = tonumber(ARGV[7]), tonumber(ARGV[12])
if rate_full(KEYS[6], now, window, tonumber(ARGV[10])) then return {'rate_limited', 'job'} end
if rate_full(KEYS[7], now, window, tonumber(ARGV[11])) then return {'rate_limited', 'cluster'} end
rate_take(KEYS[6], now, window, tonumber(ARGV[10]), ARGV[13])
rate_take(KEYS[7], now, window, tonumber(ARGV[11]), ARGV[13])
local map = {}
for _, c in ipairs(chosen) do map[c[1]] = c[2] end
for i = 1, #ranks, 2 do
  local node, rest = string.match(ranks[i + 1], '^([^|]*)(.*)$')
  if map[node] then redis.call('HSET', KEYS[3], ranks[i], map[node] .. rest) end
end
for _, c in ipairs(chosen) do
  local key = ARGV[3] .. ':node:' .. c[2]
  redis.call('SREM', KEYS[4], c[2])
  local e = redis.call('HINCRBY', key, 'epoch', 1)
  redis.call('HSET', key, 'state', 'healthy', 'reason', 'allocated to ' .. ARGV[14],
    'diagnosis', ARGV[8], 'ts_ns', ARGV[6])
  audit(KEYS[5], {'ts_ns', ARGV[6], 'action', 'allocate', 'kind', 'node', 'target', c[2],
    'from', 'spare', 'to', 'healthy', 'epoch', tostring(e), 'diagnosis', ARGV[8],
    'reason', 'replaces ' .. c[1] .. ' in ' .. ARGV[14], 'actor', ARGV[9]})
end
local job_epoch = redis.call('HINCRBY', KEYS[2], 'epoch', 1)
redis.call('HINCRBY', KEYS[2], 'restarts', 1)
redis.call('HSET', KEYS[2], 'state', 'restarting', 'ts_ns', ARGV[6])
audit(KEYS[5], {'ts_ns', ARGV[6], 'action', 'restart', 'kind', 'job', 'target', ARGV[14],
  'from', job[1], 'to', 'restarting', 'epoch', tostring(job_epoch), 'diagnosis', ARGV[8],
  'reason', 'restart ' .. tostring(restarts + 1), 'actor', ARGV[9]})
local record = cjson.encode({job = ARGV[14], diagnosis = ARGV[8], ts_ns = ARGV[6],
  replaced = chosen, attempt = restarts + 1, epoch = job_epoch})
redis.call('HSET', KEYS[1], ARGV[2], record)
return {'ok', record}
"""

# KEYS: job, job ranks, jobs. ARGV: 1 ts_ns, 2 state, 3 comms (JSON), 4 job id,
#   5.. rank, place, rank, place ... -> epoch | 0 when not newer than what is recorded
RECORD_JOB = r"""
local stored = redis.call('HGET', KEYS[1], 'ts_ns')
if stored and not newer(ARGV[1], stored) then return 0 end
redis.call('DEL', KEYS[2])
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'ts_ns', ARGV[1], 'comms', ARGV[3])
redis.call('HSETNX', KEYS[1], 'restarts', 0)
redis.call('SADD', KEYS[3], ARGV[4])
return redis.call('HINCRBY', KEYS[1], 'epoch', 1)
"""

# A scheduler's restart of a job, counted once per diagnosis, held to a limit.
# KEYS: 1 the job's restarted-for set, 2 the job's hash. ARGV: 1 diagnosis, 2 max restarts.
# Returns {answer, count}: 'counted' (a new restart), 'again' (counted for this diagnosis
# before: a retry), 'limit' (not counted: the limit is reached), 'unknown_job' (no recorded
# placement: a count alone would make the job look recorded).
COUNT_RESTART = r"""
if redis.call('EXISTS', KEYS[2]) == 0 then return {'unknown_job', '0'} end
local count = tonumber(redis.call('HGET', KEYS[2], 'restarts') or '0')
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return {'again', tostring(count)} end
if count >= tonumber(ARGV[2]) then return {'limit', tostring(count)} end
redis.call('SADD', KEYS[1], ARGV[1])
return {'counted', tostring(redis.call('HINCRBY', KEYS[2], 'restarts', 1))}
"""
