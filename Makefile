# pgrelay — the two commands: `make demo` (see it work) and `make test` (what CI runs).
SHELL := /bin/bash
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION) -X main.DateBuilt=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

.PHONY: build test demo setup bench lint clean

build:
	go build -ldflags "$(LDFLAGS)" -o bin/pgrelay .

setup:
	scripts/setup

# Setup, vet, gofmt, unit + integration tests with -race (PostgreSQL 17 + Redis), the
# PostgreSQL-dependent tests again on 14, 15 and 18, fault tests, fuzz, and lint of config/.
test: setup build
	scripts/test

lint: build
	bin/pgrelay lint config/*.yaml config/demo/*.yaml

# Runs the demo on a local PostgreSQL 17 and Redis under .demo/ (Ctrl-C stops everything).
demo: setup build
	scripts/demo

# Every benchmark, one report: docs/benchmarks.md + docs/benchmarks.png (QUICK=1: a smoke run
# of small sizes, report under bin/bench/).
bench: setup build
	scripts/bench $(if $(filter 1,$(QUICK)),--quick)

# Long runs, not in CI (scripts/soak; figures in the log and bin/soak/): `make soak` is 30 minutes of
# steady pgbench load with each replica's RSS, goroutines, fds and sockets over time and their slope;
# `make soak-churn` is three replicas for 10 minutes of pgbench with a random replica SIGKILLed or
# SIGTERMed every 20-60 s: copy = source, queues exact, takeover times. PGRELAY_SOAK_* and
# PGRELAY_CHURN_* change durations, rates and seeds (scripts/soak --help).
.PHONY: soak soak-churn
soak: setup
	scripts/soak steady

soak-churn: setup
	scripts/soak churn

clean:
	rm -rf bin .demo
