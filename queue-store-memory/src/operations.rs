//! Bulk operations on the memory store: kept in its state, stepped under
//! its lock, timed by its clock.

use chrono::TimeDelta;
use queue_core::{
    AbortOutcome, NewOperation, Operation, OperationParams, OperationState, OperationStep,
    StoreError, TakeOperation, MAX_OPERATION_PAGE,
};

use crate::store::MemoryStore;

impl MemoryStore {
    pub(crate) fn create_op(&self, new: &NewOperation) -> Result<Operation<i64>, StoreError> {
        new.check()?;
        let now = self.clock().now();
        let mut state = self.lock();
        let id = state
            .operations
            .keys()
            .next_back()
            .map_or(1, |last| last + 1);
        let op = Operation::new(id, new.clone(), now);
        state.operations.insert(id, op.clone());
        Ok(op)
    }

    pub(crate) fn read_op(&self, id: i64) -> Option<Operation<i64>> {
        self.lock().operations.get(&id).cloned()
    }

    pub(crate) fn read_ops(&self, params: &OperationParams) -> Vec<Operation<i64>> {
        let state = self.lock();
        state
            .operations
            .values()
            .rev()
            .filter(|op| params.before.is_none_or(|before| op.id < before))
            .filter(|op| {
                params
                    .states
                    .as_ref()
                    .is_none_or(|states| states.contains(&op.state))
            })
            .take(params.limit.min(MAX_OPERATION_PAGE))
            .cloned()
            .collect()
    }

    pub(crate) fn take_op(&self, take: &TakeOperation) -> Option<Operation<i64>> {
        let now = self.clock().now();
        let mut state = self.lock();
        let op = state.operations.values_mut().find(|op| {
            let silent = (now - op.updated_at).max(TimeDelta::zero());
            take.admits(op, silent.to_std().unwrap_or_default())
        })?;
        op.state = OperationState::Running;
        op.runner = Some(take.runner.clone());
        op.started_at.get_or_insert(now);
        op.updated_at = now;
        op.message = None;
        Some(op.clone())
    }

    pub(crate) fn step_op(&self, step: &OperationStep<i64>) -> Option<Operation<i64>> {
        let now = self.clock().now();
        let mut state = self.lock();
        let op = state.operations.get_mut(&step.id)?;
        step.clone().apply(op, now)?;
        Some(op.clone())
    }

    pub(crate) fn prune_ops(&self, older_than: std::time::Duration) -> u64 {
        // So far back that nothing ended before it: none to remove.
        let Some(before) = TimeDelta::from_std(older_than)
            .ok()
            .and_then(|age| self.clock().now().checked_sub_signed(age))
        else {
            return 0;
        };
        let mut state = self.lock();
        let count = state.operations.len();
        state
            .operations
            .retain(|_, op| !(op.state.is_final() && op.finished_at.is_some_and(|at| at < before)));
        (count - state.operations.len()) as u64
    }

    pub(crate) fn abort_op(&self, id: i64, by: &str) -> Option<AbortOutcome<i64>> {
        let now = self.clock().now();
        let mut state = self.lock();
        let op = state.operations.get_mut(&id)?;
        if op.state.is_final() {
            return Some(AbortOutcome::Ended(op.clone()));
        }
        op.state = OperationState::Aborted;
        op.message = Some(format!("aborted by {by}"));
        op.finished_at = Some(now);
        op.updated_at = now;
        Some(AbortOutcome::Aborted(op.clone()))
    }
}
