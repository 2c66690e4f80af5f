"""Who may do what: the four roles and the permission each RPC needs.

Pure data and rules, no I/O, so the policy can be read (and tested) in one place.
The model follows Slurm's and Kubernetes' defaults for a shared cluster: a user sees
and changes only their own jobs; an operator (admin) sees and changes everything;
agents (node) hold a credential that only lets them act for their own node.

    role     may
    read     list nodes; list, read, watch and read the logs of their own jobs
    submit   everything read may, plus submit jobs and cancel their own jobs
    admin    everything, on every user's jobs; create and revoke tokens; any job priority
    node     nothing on the Scheduler API (agents talk to Redis with their own ACL user)

Health checks and server reflection stay open (compose health checks and
`grpc_health_probe` carry no token), as Kubernetes leaves /healthz open.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    READ = "read"
    SUBMIT = "submit"
    ADMIN = "admin"
    NODE = "node"

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(f"role: unknown role {text!r}; one of {', '.join(r.value for r in cls)}") from None


class Permission(StrEnum):
    READ = "read"      # see nodes, own jobs
    SUBMIT = "submit"  # submit, cancel own jobs
    ADMIN = "admin"    # any job, tokens


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.READ: frozenset({Permission.READ}),
    Role.SUBMIT: frozenset({Permission.READ, Permission.SUBMIT}),
    Role.ADMIN: frozenset(Permission),
    Role.NODE: frozenset(),
}

# Every method of the public API and the permission it needs. A method that is not
# listed here and not open is refused: a new RPC must be given a permission on purpose.
METHOD_PERMISSION: dict[str, Permission] = {
    "/frenzy.v1.Scheduler/SubmitJob": Permission.SUBMIT,
    "/frenzy.v1.Scheduler/CancelJob": Permission.SUBMIT,
    "/frenzy.v1.Scheduler/GetJob": Permission.READ,
    "/frenzy.v1.Scheduler/ListJobs": Permission.READ,
    "/frenzy.v1.Scheduler/WatchJob": Permission.READ,
    "/frenzy.v1.Scheduler/ListNodes": Permission.READ,
    "/frenzy.v1.Scheduler/StreamLogs": Permission.READ,
    "/frenzy.v1.Scheduler/GetUsage": Permission.READ,  # own usage; every user's for admins
    # Code travels only with a submission: asking for or storing a blob is submitting.
    "/frenzy.v1.Scheduler/HasCode": Permission.SUBMIT,
    "/frenzy.v1.Scheduler/UploadCode": Permission.SUBMIT,
    "/frenzy.v1.Predictor/Predict": Permission.READ,
}

OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def is_open(method: str) -> bool:
    """Methods anyone may call without a token (health, reflection)."""
    return method.startswith(OPEN_PREFIXES)


def allows(role: Role, method: str) -> bool:
    """Whether ``role`` may call ``method`` at all (job ownership is checked by the servicer)."""
    needed = METHOD_PERMISSION.get(method)
    return needed is not None and needed in GRANTS[role]


def sees_all_jobs(role: Role) -> bool:
    return Permission.ADMIN in GRANTS[role]


def priority_refusal(role: Role, priority: int, max_user_priority: int) -> str | None:
    """Why ``role`` may not submit at ``priority``, or None. Lowering is always allowed (it only
    yields to others); raising above the cluster's cap for users (the scheduler's
    ``--max-user-priority``) is an operator's call, as Slurm reserves raising a job's priority to
    its operators, or every user would ask for the most."""
    if priority <= max_user_priority or Permission.ADMIN in GRANTS[role]:
        return None
    return (f"spec.priority: {priority} is above {max_user_priority}, the most a {role.value} token may ask "
            "(scheduler option --max-user-priority). To fix: submit with --priority "
            f"{max_user_priority} or lower, or ask an admin to submit it")
