-- Argo CD health check for DSV4Deployment (inference.dsv4.dev): add it to argocd-cm as
-- resource.customizations.health.inference.dsv4.dev_DSV4Deployment (docs/install.md).
-- It reads what kstatus reads: observedGeneration, then the Stalled, Reconciling and Ready
-- conditions.  A rollout in progress is Progressing, a rejected rollout Degraded (with the
-- verdict), the spec's flags serving on every ready replica Healthy.
local hs = {}
local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if status.observedGeneration == nil or status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the latest spec"
  return hs
end
local conditions = {}
for _, condition in ipairs(status.conditions) do
  conditions[condition.type] = condition
end
local function holds(type)
  return conditions[type] ~= nil and conditions[type].status == "True"
end
local function said(type)
  return conditions[type].reason .. ": " .. (conditions[type].message or "")
end
if holds("Stalled") then
  hs.status = "Degraded"
  hs.message = said("Stalled")
elseif holds("Reconciling") then
  hs.status = "Progressing"
  hs.message = said("Reconciling")
elseif holds("Ready") then
  hs.status = "Healthy"
  hs.message = said("Ready")
else
  hs.status = "Progressing"
  hs.message = conditions["Ready"] ~= nil and said("Ready") or "Not ready"
end
return hs
