-- Argo CD health check for crewfence.dev/CrewJob.
-- Install as argocd-cm key `resource.customizations.health.crewfence.dev_CrewJob`.
-- Argo CD runs this with gopher-lua (Lua 5.1): `obj` is the live object, the script returns `hs`.
--
-- Order matters:
--  1. a resolved uncertain outcome (status.resolution, accepted by the operator) is settled:
--     Happened -> Healthy (the work took effect), NotHappened and Compensated -> Suspended
--     (settled, not a failure, and the work is not in effect: a linked successor may run it);
--  2. an unresolved uncertain outcome is Degraded whatever else the status says: the outcome
--     is unknown, nothing will ever turn it Healthy, and a human has to reconcile it and
--     resolve it (never auto-retried);
--  3. a status the operator has not written yet, or one written for an older generation, is
--     Progressing (the spec changed, e.g. `cancel` was set, and the operator has not caught up);
--  4. otherwise the phase decides.
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

local function join(parts)
  local out = {}
  for _, p in ipairs(parts) do
    if p ~= nil and p ~= "" then
      table.insert(out, p)
    end
  end
  return table.concat(out, "; ")
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the crewfence operator to observe this CrewJob"
  return hs
end

if status.resolution ~= nil and status.resolution.outcome ~= nil and status.resolution.outcome ~= "" then
  local outcome = status.resolution.outcome
  local by = nil
  if status.resolution.resolvedBy ~= nil then
    by = "by " .. status.resolution.resolvedBy
  end
  local successor = nil
  if status.supersededBy ~= nil and status.supersededBy.name ~= nil then
    successor = "superseded by " .. status.supersededBy.name
  end
  if outcome == "Happened" then
    hs.status = "Healthy"
  else
    hs.status = "Suspended"
  end
  hs.message = join({ "Uncertain outcome resolved " .. outcome, by, status.resolution.note, successor })
  return hs
end

if status.uncertainOutcome == true then
  local reason = nil
  local cond = condition(status, "OutcomeUncertain")
  if cond ~= nil then
    reason = cond.reason
    if cond.message ~= nil and cond.message ~= "" then
      reason = join({ cond.reason, cond.message })
    end
  end
  local recovery = nil
  if status.recovery ~= nil and status.recovery ~= "" then
    recovery = "recovery: " .. status.recovery
  end
  hs.status = "Degraded"
  hs.message = join({
    "Outcome uncertain: the crew may or may not have run; reconcile before any new Action",
    reason,
    recovery,
  })
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

local phase = status.phase
if phase == nil or phase == "" or phase == "Pending" then
  hs.status = "Progressing"
  hs.message = "Pending: waiting for admission by a crew replica"
  return hs
end
if phase == "Running" then
  hs.status = "Progressing"
  hs.message = "Running"
  return hs
end
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Succeeded"
  return hs
end
if phase == "Failed" then
  local detail = nil
  if status.failure ~= nil then
    detail = join({ status.failure.category, status.failure.code, status.failure.message })
  end
  hs.status = "Degraded"
  hs.message = join({ "Failed", detail })
  return hs
end
if phase == "Cancelled" then
  -- Cancelled on request (spec.cancel in Git) is the desired state reached: Suspended, which
  -- Argo CD does not count as a failure. Cancelled without a request (deletion, timeout) is not.
  if obj.spec ~= nil and obj.spec.cancel == true then
    hs.status = "Suspended"
    hs.message = "Cancelled as requested by spec.cancel"
  else
    hs.status = "Degraded"
    hs.message = "Cancelled without spec.cancel"
  end
  return hs
end

hs.status = "Unknown"
hs.message = "Unrecognised phase " .. tostring(phase)
return hs
