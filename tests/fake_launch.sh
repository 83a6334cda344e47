#!/usr/bin/env bash
# Stand-in for launch.sh in the CPU test of bench/e2e.py: same arguments, a fake OpenAI server.
exec python "$(dirname "$0")/fake_openai_server.py" "$@"
