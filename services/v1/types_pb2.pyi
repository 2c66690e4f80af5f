from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    PRECISION_FP32: _ClassVar[Precision]
    PRECISION_FP16: _ClassVar[Precision]
    PRECISION_BF16: _ClassVar[Precision]
    PRECISION_AMP_FP16: _ClassVar[Precision]
    PRECISION_AMP_BF16: _ClassVar[Precision]
    PRECISION_PURE_BF16: _ClassVar[Precision]
    PRECISION_FSDP_BF16: _ClassVar[Precision]

class Optimizer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPTIMIZER_UNSPECIFIED: _ClassVar[Optimizer]
    OPTIMIZER_ADAMW: _ClassVar[Optimizer]
    OPTIMIZER_ADAM: _ClassVar[Optimizer]
    OPTIMIZER_SGD: _ClassVar[Optimizer]
    OPTIMIZER_SGD_MOMENTUM: _ClassVar[Optimizer]
    OPTIMIZER_ADAM8BIT: _ClassVar[Optimizer]

class Finetune(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINETUNE_UNSPECIFIED: _ClassVar[Finetune]
    FINETUNE_FULL: _ClassVar[Finetune]
    FINETUNE_LORA: _ClassVar[Finetune]
    FINETUNE_QLORA: _ClassVar[Finetune]

class Objective(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECTIVE_UNSPECIFIED: _ClassVar[Objective]
    OBJECTIVE_TIME: _ClassVar[Objective]
    OBJECTIVE_COST: _ClassVar[Objective]
    OBJECTIVE_GPU_HOURS: _ClassVar[Objective]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RESERVED: _ClassVar[JobState]
    JOB_STATE_LAUNCHING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
PRECISION_UNSPECIFIED: Precision
PRECISION_FP32: Precision
PRECISION_FP16: Precision
PRECISION_BF16: Precision
PRECISION_AMP_FP16: Precision
PRECISION_AMP_BF16: Precision
PRECISION_PURE_BF16: Precision
PRECISION_FSDP_BF16: Precision
OPTIMIZER_UNSPECIFIED: Optimizer
OPTIMIZER_ADAMW: Optimizer
OPTIMIZER_ADAM: Optimizer
OPTIMIZER_SGD: Optimizer
OPTIMIZER_SGD_MOMENTUM: Optimizer
OPTIMIZER_ADAM8BIT: Optimizer
FINETUNE_UNSPECIFIED: Finetune
FINETUNE_FULL: Finetune
FINETUNE_LORA: Finetune
FINETUNE_QLORA: Finetune
OBJECTIVE_UNSPECIFIED: Objective
OBJECTIVE_TIME: Objective
OBJECTIVE_COST: Objective
OBJECTIVE_GPU_HOURS: Objective
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RESERVED: JobState
JOB_STATE_LAUNCHING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class ModelSpec(_message.Message):
    __slots__ = ("catalog_name", "config_json", "display_name")
    CATALOG_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    catalog_name: str
    config_json: str
    display_name: str
    def __init__(self, catalog_name: _Optional[str] = ..., config_json: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class TrainingRecipe(_message.Message):
    __slots__ = ("seq_len", "global_batch", "micro_batch", "precision", "optimizer", "allow_recompute", "flash_attention", "train_steps", "zero_stages", "finetune", "lora_rank", "weight_decay", "ep", "pp_layers", "etp", "lora_targets", "compile", "float8", "lora_dropout", "lora_adapter_dtype", "fsdp_reshard", "qlora_backend", "main_grad_dtype")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    ALLOW_RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    ZERO_STAGES_FIELD_NUMBER: _ClassVar[int]
    FINETUNE_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    PP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    ETP_FIELD_NUMBER: _ClassVar[int]
    LORA_TARGETS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    FLOAT8_FIELD_NUMBER: _ClassVar[int]
    LORA_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_DTYPE_FIELD_NUMBER: _ClassVar[int]
    FSDP_RESHARD_FIELD_NUMBER: _ClassVar[int]
    QLORA_BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAIN_GRAD_DTYPE_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    global_batch: int
    micro_batch: int
    precision: Precision
    optimizer: Optimizer
    allow_recompute: bool
    flash_attention: bool
    train_steps: int
    zero_stages: _containers.RepeatedScalarFieldContainer[int]
    finetune: Finetune
    lora_rank: int
    weight_decay: float
    ep: int
    pp_layers: _containers.RepeatedScalarFieldContainer[int]
    etp: int
    lora_targets: _containers.RepeatedScalarFieldContainer[str]
    compile: bool
    float8: bool
    lora_dropout: float
    lora_adapter_dtype: str
    fsdp_reshard: str
    qlora_backend: str
    main_grad_dtype: str
    def __init__(self, seq_len: _Optional[int] = ..., global_batch: _Optional[int] = ..., micro_batch: _Optional[int] = ..., precision: _Optional[_Union[Precision, str]] = ..., optimizer: _Optional[_Union[Optimizer, str]] = ..., allow_recompute: _Optional[bool] = ..., flash_attention: _Optional[bool] = ..., train_steps: _Optional[int] = ..., zero_stages: _Optional[_Iterable[int]] = ..., finetune: _Optional[_Union[Finetune, str]] = ..., lora_rank: _Optional[int] = ..., weight_decay: _Optional[float] = ..., ep: _Optional[int] = ..., pp_layers: _Optional[_Iterable[int]] = ..., etp: _Optional[int] = ..., lora_targets: _Optional[_Iterable[str]] = ..., compile: _Optional[bool] = ..., float8: _Optional[bool] = ..., lora_dropout: _Optional[float] = ..., lora_adapter_dtype: _Optional[str] = ..., fsdp_reshard: _Optional[str] = ..., qlora_backend: _Optional[str] = ..., main_grad_dtype: _Optional[str] = ...) -> None: ...

class JobGoal(_message.Message):
    __slots__ = ("objective", "deadline_s", "budget_usd")
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USD_FIELD_NUMBER: _ClassVar[int]
    objective: Objective
    deadline_s: float
    budget_usd: float
    def __init__(self, objective: _Optional[_Union[Objective, str]] = ..., deadline_s: _Optional[float] = ..., budget_usd: _Optional[float] = ...) -> None: ...

class JobLimits(_message.Message):
    __slots__ = ("max_gpus", "allowed_gpu_types", "min_gpus")
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_GPU_TYPES_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    max_gpus: int
    allowed_gpu_types: _containers.RepeatedScalarFieldContainer[str]
    min_gpus: int
    def __init__(self, max_gpus: _Optional[int] = ..., allowed_gpu_types: _Optional[_Iterable[str]] = ..., min_gpus: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "model", "recipe", "command", "env", "workdir", "limits", "idempotency_key", "code_sha256", "priority", "max_oom_retries", "resumable", "goal")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CODE_SHA256_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_OOM_RETRIES_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: ModelSpec
    recipe: TrainingRecipe
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workdir: str
    limits: JobLimits
    idempotency_key: str
    code_sha256: str
    priority: int
    max_oom_retries: int
    resumable: bool
    goal: JobGoal
    def __init__(self, name: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., recipe: _Optional[_Union[TrainingRecipe, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., limits: _Optional[_Union[JobLimits, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., code_sha256: _Optional[str] = ..., priority: _Optional[int] = ..., max_oom_retries: _Optional[int] = ..., resumable: _Optional[bool] = ..., goal: _Optional[_Union[JobGoal, _Mapping]] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("tp", "pp", "dp", "zero_stage", "micro_batch", "grad_accum", "recompute", "vpp")
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    ZERO_STAGE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRAD_ACCUM_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    VPP_FIELD_NUMBER: _ClassVar[int]
    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch: int
    grad_accum: int
    recompute: str
    vpp: int
    def __init__(self, tp: _Optional[int] = ..., pp: _Optional[int] = ..., dp: _Optional[int] = ..., zero_stage: _Optional[int] = ..., micro_batch: _Optional[int] = ..., grad_accum: _Optional[int] = ..., recompute: _Optional[str] = ..., vpp: _Optional[int] = ...) -> None: ...

class MemoryBreakdown(_message.Message):
    __slots__ = ("parameters", "gradients", "optimizer_states", "activations", "logits", "runtime_reserve", "total", "buffers", "transient", "fragmentation", "peak_allocated", "reserved", "phase")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_RESERVE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    TRANSIENT_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTATION_FIELD_NUMBER: _ClassVar[int]
    PEAK_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    logits: int
    runtime_reserve: int
    total: int
    buffers: int
    transient: int
    fragmentation: int
    peak_allocated: int
    reserved: int
    phase: str
    def __init__(self, parameters: _Optional[int] = ..., gradients: _Optional[int] = ..., optimizer_states: _Optional[int] = ..., activations: _Optional[int] = ..., logits: _Optional[int] = ..., runtime_reserve: _Optional[int] = ..., total: _Optional[int] = ..., buffers: _Optional[int] = ..., transient: _Optional[int] = ..., fragmentation: _Optional[int] = ..., peak_allocated: _Optional[int] = ..., reserved: _Optional[int] = ..., phase: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("gpu_type", "num_gpus", "layout", "memory", "peak_bytes_per_gpu", "gpu_memory_bytes", "headroom_bytes", "step_time_s", "tokens_per_s", "gpu_hours", "rank", "completion_s", "explanation", "gpus_by_type", "kind", "micro_batches", "stages", "cost_usd")
    class GpusByTypeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_PER_GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_S_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    GPUS_BY_TYPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    num_gpus: int
    layout: Layout
    memory: MemoryBreakdown
    peak_bytes_per_gpu: int
    gpu_memory_bytes: int
    headroom_bytes: int
    step_time_s: float
    tokens_per_s: float
    gpu_hours: float
    rank: int
    completion_s: float
    explanation: str
    gpus_by_type: _containers.ScalarMap[str, int]
    kind: str
    micro_batches: int
    stages: _containers.RepeatedCompositeFieldContainer[PlanStage]
    cost_usd: float
    def __init__(self, gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., memory: _Optional[_Union[MemoryBreakdown, _Mapping]] = ..., peak_bytes_per_gpu: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., headroom_bytes: _Optional[int] = ..., step_time_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., gpu_hours: _Optional[float] = ..., rank: _Optional[int] = ..., completion_s: _Optional[float] = ..., explanation: _Optional[str] = ..., gpus_by_type: _Optional[_Mapping[str, int]] = ..., kind: _Optional[str] = ..., micro_batches: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[PlanStage, _Mapping]]] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class PlanStage(_message.Message):
    __slots__ = ("index", "first_layer", "last_layer", "tp", "shares")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_LAYER_FIELD_NUMBER: _ClassVar[int]
    LAST_LAYER_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    index: int
    first_layer: int
    last_layer: int
    tp: int
    shares: _containers.RepeatedCompositeFieldContainer[TypeShare]
    def __init__(self, index: _Optional[int] = ..., first_layer: _Optional[int] = ..., last_layer: _Optional[int] = ..., tp: _Optional[int] = ..., shares: _Optional[_Iterable[_Union[TypeShare, _Mapping]]] = ...) -> None: ...

class TypeShare(_message.Message):
    __slots__ = ("gpu_type", "gpus", "micro_batch", "grad_accum", "peak_bytes")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRAD_ACCUM_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    gpus: int
    micro_batch: int
    grad_accum: int
    peak_bytes: int
    def __init__(self, gpu_type: _Optional[str] = ..., gpus: _Optional[int] = ..., micro_batch: _Optional[int] = ..., grad_accum: _Optional[int] = ..., peak_bytes: _Optional[int] = ...) -> None: ...

class GpuPool(_message.Message):
    __slots__ = ("gpu_type", "total_gpus", "gpus_per_node", "price_per_gpu_hour")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    total_gpus: int
    gpus_per_node: int
    price_per_gpu_hour: float
    def __init__(self, gpu_type: _Optional[str] = ..., total_gpus: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., price_per_gpu_hour: _Optional[float] = ...) -> None: ...

class StateTransition(_message.Message):
    __slots__ = ("state", "at", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    at: float
    reason: str
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., at: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeAssignment(_message.Message):
    __slots__ = ("node", "gpu_indices")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "state", "history", "plan", "placement", "pending_reason", "attempt", "submitted_at", "exit_codes", "candidate_plans", "model_name", "parameter_count", "log_paths", "failed_node", "failed_node_rank", "failed_exit_code", "pids", "master_addr", "master_port", "max_attempts", "user", "attempts", "oom_threshold")
    class ExitCodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LogPathsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PidsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_PLANS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOG_PATHS_FIELD_NUMBER: _ClassVar[int]
    FAILED_NODE_FIELD_NUMBER: _ClassVar[int]
    FAILED_NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    FAILED_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    OOM_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    state: JobState
    history: _containers.RepeatedCompositeFieldContainer[StateTransition]
    plan: Plan
    placement: _containers.RepeatedCompositeFieldContainer[NodeAssignment]
    pending_reason: str
    attempt: int
    submitted_at: float
    exit_codes: _containers.ScalarMap[str, int]
    candidate_plans: _containers.RepeatedCompositeFieldContainer[Plan]
    model_name: str
    parameter_count: int
    log_paths: _containers.ScalarMap[str, str]
    failed_node: str
    failed_node_rank: int
    failed_exit_code: int
    pids: _containers.ScalarMap[str, int]
    master_addr: str
    master_port: int
    max_attempts: int
    user: str
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    oom_threshold: float
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., history: _Optional[_Iterable[_Union[StateTransition, _Mapping]]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., placement: _Optional[_Iterable[_Union[NodeAssignment, _Mapping]]] = ..., pending_reason: _Optional[str] = ..., attempt: _Optional[int] = ..., submitted_at: _Optional[float] = ..., exit_codes: _Optional[_Mapping[str, int]] = ..., candidate_plans: _Optional[_Iterable[_Union[Plan, _Mapping]]] = ..., model_name: _Optional[str] = ..., parameter_count: _Optional[int] = ..., log_paths: _Optional[_Mapping[str, str]] = ..., failed_node: _Optional[str] = ..., failed_node_rank: _Optional[int] = ..., failed_exit_code: _Optional[int] = ..., pids: _Optional[_Mapping[str, int]] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., max_attempts: _Optional[int] = ..., user: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., oom_threshold: _Optional[float] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "gpu_type", "num_gpus", "layout", "predicted_peak_bytes", "gpu_memory_bytes", "observed_peak_bytes", "exit_code", "cause", "node", "tail", "outcome", "ended_at")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    gpu_type: str
    num_gpus: int
    layout: Layout
    predicted_peak_bytes: int
    gpu_memory_bytes: int
    observed_peak_bytes: int
    exit_code: int
    cause: str
    node: str
    tail: _containers.RepeatedScalarFieldContainer[str]
    outcome: str
    ended_at: float
    def __init__(self, attempt: _Optional[int] = ..., gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., predicted_peak_bytes: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., observed_peak_bytes: _Optional[int] = ..., exit_code: _Optional[int] = ..., cause: _Optional[str] = ..., node: _Optional[str] = ..., tail: _Optional[_Iterable[str]] = ..., outcome: _Optional[str] = ..., ended_at: _Optional[float] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory: int
    def __init__(self, pid: _Optional[int] = ..., used_memory: _Optional[int] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "gpu_type", "nvml_name", "memory_total", "memory_free", "healthy", "owner", "pci_bus_id", "utilization_pct", "processes", "health_reason", "links", "type_from_memory")
    class LinksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NVML_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FROM_MEMORY_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    gpu_type: str
    nvml_name: str
    memory_total: int
    memory_free: int
    healthy: bool
    owner: str
    pci_bus_id: str
    utilization_pct: int
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    health_reason: str
    links: _containers.ScalarMap[int, str]
    type_from_memory: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., gpu_type: _Optional[str] = ..., nvml_name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_free: _Optional[int] = ..., healthy: _Optional[bool] = ..., owner: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., utilization_pct: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., health_reason: _Optional[str] = ..., links: _Optional[_Mapping[int, str]] = ..., type_from_memory: _Optional[bool] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "addr", "alive", "draining", "heartbeat_at", "gpus", "declared_dead_at", "health_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DECLARED_DEAD_AT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    addr: str
    alive: bool
    draining: bool
    heartbeat_at: float
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    declared_dead_at: float
    health_reason: str
    def __init__(self, name: _Optional[str] = ..., addr: _Optional[str] = ..., alive: _Optional[bool] = ..., draining: _Optional[bool] = ..., heartbeat_at: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., declared_dead_at: _Optional[float] = ..., health_reason: _Optional[str] = ...) -> None: ...
