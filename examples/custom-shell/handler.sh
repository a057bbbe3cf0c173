#!/bin/sh
# The function: the event arrives as JSON on stdin; stdout is the answer.
event=$(cat)
echo "hello from sh, request $SLESS_REQUEST_ID" >&2
printf 'you sent %s bytes\n' "${#event}"
