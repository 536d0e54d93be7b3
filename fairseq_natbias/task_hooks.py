"""The one place this plugin wraps the task fairseq trains: its
``train_step``, ``valid_step``, ``reduce_metrics`` and ``begin_epoch``, once
per task, for the two parts that need what only the task sees: the model's
logging hook (:class:`fairseq_natbias.logging_hook.BiasDivergenceHook`) and
the unigram regulariser (:mod:`fairseq_natbias.unigram_regularized_cross_entropy`).

Why the task: in fairseq 0.12 only these see, whatever the criterion, the
update number (the trainer never tells a criterion), whether a step is due
for statistics, its logging output and the reduced logs; a task subclass per
fairseq task would leave a user's own task without them. Each call goes to
the latest hook and regulariser attached to the task.
"""

import functools

HOOK, REGULARIZER = "_natbias_hook", "_unigram_reg_criterion"


def attach(task, hook=None, regularizer=None) -> None:
    """Make ``hook`` (the logging hook) or ``regularizer`` the task's,
    wrapping the task the first time."""
    if not hasattr(task, HOOK):
        setattr(task, HOOK, None)
        setattr(task, REGULARIZER, None)
        _wrap(task)
    if hook is not None:
        setattr(task, HOOK, hook)
    if regularizer is not None:
        setattr(task, REGULARIZER, regularizer)


def _wrap(task) -> None:
    train_step, valid_step = task.train_step, task.valid_step
    reduce_metrics, begin_epoch = task.reduce_metrics, task.begin_epoch

    def hooked_train_step(sample, model, criterion, optimizer, update_num, *a, **k):
        # fairseq's convention (task.train_step tells the model so): updates done so far.
        if hasattr(criterion, "set_num_updates"):
            criterion.set_num_updates(update_num)
        step = functools.partial(train_step, sample, model, criterion, optimizer, update_num)
        hook = getattr(task, HOOK)
        if hook is None:
            return step(*a, **k)
        return hook.around_step(functools.partial(step, *a, **k), update_num)

    def hooked_valid_step(sample, model, criterion, *a, **k):
        step = functools.partial(valid_step, sample, model, criterion, *a, **k)
        hook = getattr(task, HOOK)
        return step() if hook is None else hook.around_step(step, None)

    def hooked_reduce_metrics(logging_outputs, criterion):
        reduce_metrics(logging_outputs, criterion)
        if getattr(task, HOOK) is not None:
            getattr(task, HOOK).log(logging_outputs)

    def hooked_begin_epoch(epoch, model):
        if getattr(task, REGULARIZER) is not None:
            getattr(task, REGULARIZER).prepare(model)
        return begin_epoch(epoch, model)

    task.train_step, task.valid_step = hooked_train_step, hooked_valid_step
    task.reduce_metrics, task.begin_epoch = hooked_reduce_metrics, hooked_begin_epoch
