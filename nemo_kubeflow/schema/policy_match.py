"""Which admission webhooks and ValidatingAdmissionPolicies take part in creating a job's objects (its TrainJob,
JobSet, Jobs and pods) in a namespace, read off their rules and selectors (objects in, facts out), as the API
server matches them: a rule's API groups, resources and operations, the namespace selector against the
namespace's labels. What a policy then decides is its own (its CEL or its webhook): doctor reports who is
asked, not what they will answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_kubeflow.constants import JOBSET_GROUP, TRAINER_GROUP, TRAINJOB_PLURAL
from nemo_kubeflow.schema.job_pods import dict_items
from nemo_kubeflow.schema.problems import _dict

#: The objects a job's creation makes: (API group, resource), in the order they are made.
JOB_OBJECTS = ((TRAINER_GROUP, TRAINJOB_PLURAL), (JOBSET_GROUP, "jobsets"), ("batch", "jobs"), ("", "pods"))


@dataclass(frozen=True)
class Match:
    """One webhook or policy that the job's objects meet: what it is, what of ours it matches, its failure
    policy (what happens when it cannot answer) and, for a policy, how its bindings act."""

    what: str
    matches: tuple[str, ...]
    failure_policy: str
    actions: str = ""

    def __str__(self) -> str:
        acts = f", {self.actions}" if self.actions else ""
        return f"{self.what} matches {', '.join(self.matches)} (failurePolicy {self.failure_policy}{acts})"


def matching_webhooks(kind: str, configurations: list[dict], namespace_labels: dict) -> list[Match]:
    """The webhooks of ``configurations`` (``kind``: Validating/MutatingWebhookConfiguration) whose rules and
    namespace selector take in the job's objects created in a namespace with ``namespace_labels``."""
    found = []
    for config in configurations:
        name = _dict(config.get("metadata")).get("name")
        for hook in dict_items(config.get("webhooks")):
            if not selects(_dict(hook.get("namespaceSelector")), namespace_labels):
                continue
            matched = _matched(dict_items(hook.get("rules")))
            if matched:
                what = f"{kind} {name}/{hook.get('name')}"
                found.append(Match(what, matched, str(hook.get("failurePolicy", "Fail"))))
    return found


def matching_policies(policies: list[dict], bindings: list[dict], namespace_labels: dict) -> list[Match]:
    """The ValidatingAdmissionPolicies that match the job's objects and are bound (a binding whose namespace
    selector takes in the namespace): a policy without a binding does nothing."""
    found = []
    for policy in policies:
        name = _dict(policy.get("metadata")).get("name")
        spec = _dict(policy.get("spec"))
        constraints = _dict(spec.get("matchConstraints"))
        if not selects(_dict(constraints.get("namespaceSelector")), namespace_labels):
            continue
        matched = _matched(dict_items(constraints.get("resourceRules")))
        bound = [b for b in bindings if _binds(b, name, namespace_labels)]
        if matched and bound:
            actions = "; ".join(
                f"binding {_dict(b.get('metadata')).get('name')}: {'/'.join(_dict(b.get('spec')).get('validationActions') or [])}"
                for b in bound
            )
            found.append(
                Match(f"ValidatingAdmissionPolicy {name}", matched, str(spec.get("failurePolicy", "Fail")), actions)
            )
    return found


def _binds(binding: dict, policy: Any, namespace_labels: dict) -> bool:
    spec = _dict(binding.get("spec"))
    resources = _dict(spec.get("matchResources"))
    return spec.get("policyName") == policy and selects(_dict(resources.get("namespaceSelector")), namespace_labels)


def _matched(rules: list[dict]) -> tuple[str, ...]:
    """Which of the job's objects ``rules`` match on CREATE (their resource names)."""
    return tuple(resource for group, resource in JOB_OBJECTS if any(_rule_matches(r, group, resource) for r in rules))


def _rule_matches(rule: dict, group: str, resource: str) -> bool:
    operations = rule.get("operations") or []
    return (
        any(o in ("CREATE", "*") for o in operations)
        and any(g in (group, "*") for g in rule.get("apiGroups") or [])
        and any(r in (resource, "*", "*/*") for r in rule.get("resources") or [])
    )


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) takes in ``labels``; an empty one takes all."""
    if any(labels.get(k) != v for k, v in _dict(selector.get("matchLabels")).items()):
        return False
    return all(_expression(e, labels) for e in dict_items(selector.get("matchExpressions")))


def _expression(expression: dict, labels: dict) -> bool:
    key, values = expression.get("key"), expression.get("values") or []
    return {
        "In": labels.get(key) in values,
        "NotIn": labels.get(key) not in values,
        "Exists": key in labels,
        "DoesNotExist": key not in labels,
    }.get(str(expression.get("operator")), False)
