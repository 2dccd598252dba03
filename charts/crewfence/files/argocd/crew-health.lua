-- Argo CD health check for crewfence.dev/Crew.
-- Install as argocd-cm key `resource.customizations.health.crewfence.dev_Crew`.
-- Argo CD runs this with gopher-lua (Lua 5.1): `obj` is the live object, the script returns `hs`.
--
-- A fenced replica is Degraded even while the Ready condition is still True: the operator stops
-- dispatching to it and a human has to find what else mounts its state claim.
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

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the crewfence operator to observe this Crew"
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

if status.replicas ~= nil then
  for _, r in ipairs(status.replicas) do
    if r.fenced == true then
      hs.status = "Degraded"
      local reason = r.fenceReason
      if reason == nil or reason == "" then
        reason = "state claim shared"
      end
      hs.message = "Replica " .. tostring(r.pod or r.ordinal) .. " is fenced: " .. reason
      return hs
    end
  end
end

local function degraded_when(kind, value, prefix)
  local c = condition(status, kind)
  if c ~= nil and c.status == value then
    hs.status = "Degraded"
    hs.message = prefix .. (c.message or c.reason or "see the Crew's conditions")
    return true
  end
  return false
end

if degraded_when("StateVolumeShared", "True", "A state volume is shared: ") then
  return hs
end
-- A hosted model without its API key fails every job, however ready the pods are.
if degraded_when("ModelCredentials", "False", "Model credentials missing: ") then
  return hs
end

local ready = condition(status, "Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end

-- kstatus convention: Stalled=True means the operator gave up until the spec changes.
local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message or stalled.reason or "Stalled"
  return hs
end

hs.status = "Progressing"
hs.message = ready.message or ready.reason or "Not ready yet"
return hs
