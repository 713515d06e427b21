package main

import (
	"flag"
	"fmt"
)

// intentFlags registers propose's --run-id, --step, --action and --fork-of
// and returns the function that adds "intent" and "fork_of" to a body.
func intentFlags(fs *flag.FlagSet) func(set map[string]bool, body map[string]any) error {
	runID := fs.String("run-id", "", "the intent's workflow run (with --step and --action)")
	step := fs.String("step", "", "the intent's step in the run")
	action := fs.String("action", "", "the intent's action in the step")
	forkOf := fs.String("fork-of", "", "a fork: the intent's terminal latest `authorization`, superseded by a new use")
	return func(set map[string]bool, body map[string]any) error {
		n := 0
		for _, name := range []string{"run-id", "step", "action"} {
			if set[name] {
				n++
			}
		}
		switch {
		case n == 0 && set["fork-of"]:
			return fmt.Errorf("--fork-of needs the intent: --run-id, --step and --action")
		case n == 0:
			return nil
		case n < 3:
			return fmt.Errorf("an intent is --run-id, --step and --action together")
		}
		body["intent"] = map[string]any{"run_id": *runID, "step": *step, "action": *action}
		if set["fork-of"] {
			body["fork_of"] = *forkOf
		}
		return nil
	}
}
