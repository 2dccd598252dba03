-- Argo CD health check for crewfence.dev/CrewCronJob.
-- Install as argocd-cm key `resource.customizations.health.crewfence.dev_CrewCronJob`.
-- Argo CD runs this with gopher-lua (Lua 5.1): `obj` is the live object, the script returns `hs`.
--
-- Order matters:
--  1. no status yet, or one written for an older generation: Progressing;
--  2. Stalled=True (an invalid schedule, time zone or job template): Degraded, nothing runs;
--  3. Paused=True (a child's uncertain outcome waits for a person; onUncertain Pause): Degraded,
--     because no tick runs until somebody resolves that CrewJob;
--  4. spec.suspend (Suspended=True): Suspended, the desired state reached;
--  5. otherwise Healthy; missed ticks (older than the catch-up window) are named in the message.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function is_true(status, kind)
  local c = condition(status, kind)
  return c ~= nil and c.status == "True", c
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the crewfence operator to observe this CrewCronJob"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if status.observedGeneration == nil or (generation ~= nil and status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the crewfence operator to observe the latest spec"
  return hs
end

local stalled, stalled_cond = is_true(status, "Stalled")
if stalled then
  hs.status = "Degraded"
  hs.message = "Not scheduling: " .. tostring(stalled_cond.reason) .. ": " .. tostring(stalled_cond.message)
  return hs
end

local paused, paused_cond = is_true(status, "Paused")
if paused then
  hs.status = "Degraded"
  hs.message = "Paused: " .. tostring(paused_cond.message)
  return hs
end

local suspended = is_true(status, "Suspended")
if suspended or (obj.spec ~= nil and obj.spec.suspend == true) then
  hs.status = "Suspended"
  hs.message = "Suspended by spec.suspend: due ticks are skipped"
  return hs
end

hs.status = "Healthy"
local parts = { "Scheduling" }
if status.nextScheduleTime ~= nil then
  table.insert(parts, "next tick " .. status.nextScheduleTime)
end
if status.missedTicks ~= nil and status.missedTicks > 0 then
  table.insert(parts, tostring(status.missedTicks) .. " tick(s) missed (older than the catch-up window)")
end
hs.message = table.concat(parts, "; ")
return hs
