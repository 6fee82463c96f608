-- Argo CD health check for mtp-operator.io/MTPInference.
-- Install: argocd-cm key `resource.customizations.health.mtp-operator.io_MTPInference`
-- (see README.md, "Argo CD and Flux"). Written for Argo CD's Lua (gopher-lua, Lua 5.1);
-- tests/unit/deploy/test_argocd_health.py runs it under real Lua 5.1 and 5.4 interpreters.
--
-- Rules, in order:
--   status.observedGeneration < metadata.generation -> Progressing (operator has not seen the spec)
--   phase Invalid, or condition Degraded=True        -> Degraded (with the condition's message)
--   condition Ready=True                             -> Healthy
--   anything else                                    -> Progressing
local hs = { status = "Progressing", message = "Waiting for mtp-operator to reconcile" }

if obj.status == nil then
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for mtp-operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = {}
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type ~= nil then
      conditions[condition.type] = condition
    end
  end
end

local function message_of(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return fallback
end

local degraded = conditions["Degraded"]
if obj.status.phase == "Invalid" then
  hs.status = "Degraded"
  hs.message = "Invalid spec: " .. message_of(degraded, "see status.conditions")
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  local reason = degraded.reason or "Degraded"
  hs.message = reason .. ": " .. message_of(degraded, "see status.conditions")
  return hs
end

local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  local parts = {}
  if obj.status.poolsSummary ~= nil and obj.status.poolsSummary ~= "" then
    table.insert(parts, "pools " .. obj.status.poolsSummary)
  end
  table.insert(parts, message_of(ready, "ready"))
  local rolled = conditions["SpeculationRolledBack"]
  if rolled ~= nil and rolled.status == "True" then
    table.insert(parts, "speculation rolled back: " .. message_of(rolled, "see status.rollbacks"))
  end
  hs.message = table.concat(parts, "; ")
  return hs
end

local progressing = conditions["Progressing"]
if progressing ~= nil and progressing.status == "True" then
  hs.message = message_of(progressing, "Rolling out")
elseif ready ~= nil then
  hs.message = message_of(ready, "Waiting for pools to become ready")
end
return hs
