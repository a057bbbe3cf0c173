package main

import "context"

// HandleContext is called once per request; ctx's deadline is the function's timeout_sec.
// (A plain `func Handle(event map[string]any) (any, error)` works too.)
func HandleContext(ctx context.Context, event map[string]any) (any, error) {
	query, _ := event["query"].(map[string]any)
	name, _ := query["name"].(string)
	if name == "" {
		name = "world"
	}
	return map[string]any{"hello": name, "request": SlessContextFrom(ctx).RequestID}, nil
}
