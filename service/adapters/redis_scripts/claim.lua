-- claim: which job writes to an outputDir, and no outputDir inside or above another job's.
-- Every claim is a member of one sorted set (all scores 0, ordered by their bytes), so one
-- script sees them all (one key: one Redis Cluster slot) and finds, by ZRANGEBYLEX, the
-- claims on a directory and on anything inside it in O(log N), and those on each directory
-- it lies in with one lookup per level.
--
-- KEYS[1] claims  {P}:output-claims   sorted set of "<dir>/\0<job rkey>\0<claimed at ms>"
--
-- ARGV[1] mode    "claim" | "release"
-- ARGV[2] job     the job's rkey
-- ARGV[3] now_ms  the caller's clock
-- ARGV[4] stale   "" or the holder the caller found stale (its job gone or moved elsewhere)
-- ARGV[5] grace   ms: a claim younger than this is never taken as stale (its job's first
--                 commit may still be on its way)
-- ARGV[6] dir     the outputDir as it lies on disk, canonical (no trailing "/")
-- ARGV[7..] the directories it lies in ("/a", "/a/b" for "/a/b/c")
--
-- A "<dir>/" ends every claimed directory, so the claims on <dir> and inside it are exactly
-- the members from "<dir>/" up to (not including) "<dir>0" ("0" follows "/"), and those on
-- <dir> alone the members from "<dir>/\0" up to "<dir>/\1".
--
-- claim: returns nil when the job holds the claim now (taken, kept, or the conflicting
-- claims of the stale holder past the grace removed), else {holder rkey, its dir}: the first
-- claim of another job on the dir, inside it, or on a directory above it. A job's own
-- claims never conflict (a job moving to a subdirectory holds both until the old is
-- released). release: deletes the job's claim on the dir; returns 1 if it did, 0 otherwise.

local key, job, dir = KEYS[1], ARGV[2], ARGV[6]

local function parse(member)
  local cut = string.find(member, '\0', 1, true)
  local rest = string.sub(member, cut + 1)
  local sep = string.find(rest, '\0', 1, true)
  return string.sub(member, 1, cut - 2), string.sub(rest, 1, sep - 1),
    tonumber(string.sub(rest, sep + 1)) or 0
end

local function own(d)
  return redis.call('ZRANGEBYLEX', key, '[' .. d .. '/\0', '(' .. d .. '/\1')
end

if ARGV[1] == 'release' then
  local released = 0
  for _, member in ipairs(own(dir)) do
    local _, holder = parse(member)
    if holder == job then
      redis.call('ZREM', key, member)
      released = 1
    end
  end
  return released
end

local now, stale, grace = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])

-- the first claim of another job between min and max, read a page at a time (the range of
-- a directory that holds many jobs' outputDirs is long, and only its first one is needed)
local function conflict(min, max)
  local skipped = 0
  while true do
    local page = redis.call('ZRANGEBYLEX', key, min, max, 'LIMIT', skipped, 8)
    if #page == 0 then
      return nil
    end
    for _, member in ipairs(page) do
      local held, holder, since = parse(member)
      if holder == job then
        skipped = skipped + 1
      elseif holder == stale and now - since > grace then
        redis.call('ZREM', key, member)
      else
        return {holder, held}
      end
    end
  end
end

local found = conflict('[' .. dir .. '/', '(' .. dir .. '0')
for i = 7, #ARGV do
  if found then
    break
  end
  found = conflict('[' .. ARGV[i] .. '/\0', '(' .. ARGV[i] .. '/\1')
end
if found then
  return found
end
for _, member in ipairs(own(dir)) do
  redis.call('ZREM', key, member)
end
redis.call('ZADD', key, 0, dir .. '/\0' .. job .. '\0' .. ARGV[3])
return false
