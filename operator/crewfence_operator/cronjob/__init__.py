"""CrewCronJob: the schedule (pure), the tick decisions (pure), child naming and the trigger."""
