"""The one place the plugin wraps the task fairseq trains (``train_step``,
``valid_step``, ``reduce_metrics``, ``begin_epoch``; once per task), for the
logging hook (:mod:`fairseq_natbias.logging_hook`) and the unigram regulariser.
Why the task: in fairseq 0.12 only these see, whatever the criterion, the
update number (the trainer never tells a criterion), whether a step is due
for statistics, its logging output and the reduced logs; a task subclass per
fairseq task would leave a user's own task without them."""

import functools


def attach(task, hook=None, regularizer=None) -> None:
    """Make ``hook`` or ``regularizer`` the task's (the latest built wins)."""
    if not hasattr(task, "_natbias_hook"):
        task._natbias_hook = task._unigram_reg_criterion = None
        _wrap(task)
    task._natbias_hook = hook or task._natbias_hook
    task._unigram_reg_criterion = regularizer or task._unigram_reg_criterion


def _wrap(task) -> None:
    train_step, valid_step = task.train_step, task.valid_step
    reduce_metrics, begin_epoch = task.reduce_metrics, task.begin_epoch

    def hooked_train_step(sample, model, criterion, optimizer, update_num, *a, **k):
        # fairseq's convention (task.train_step tells the model so): updates done so far.
        if hasattr(criterion, "set_num_updates"):
            criterion.set_num_updates(update_num)
        step = functools.partial(
            train_step, sample, model, criterion, optimizer, update_num, *a, **k
        )
        hook = task._natbias_hook
        return step() if hook is None else hook.around_step(step, update_num)

    def hooked_valid_step(sample, model, criterion, *a, **k):
        step = functools.partial(valid_step, sample, model, criterion, *a, **k)
        return step() if task._natbias_hook is None else task._natbias_hook.around_step(step, None)

    def hooked_reduce_metrics(logging_outputs, criterion):
        reduce_metrics(logging_outputs, criterion)
        if task._natbias_hook is not None:
            task._natbias_hook.log(logging_outputs)

    def hooked_begin_epoch(epoch, model):
        if task._unigram_reg_criterion is not None:  # counts omega before the first update
            task._unigram_reg_criterion.prepare(model)
        return begin_epoch(epoch, model)

    task.train_step, task.valid_step = hooked_train_step, hooked_valid_step
    task.reduce_metrics, task.begin_epoch = hooked_reduce_metrics, hooked_begin_epoch
