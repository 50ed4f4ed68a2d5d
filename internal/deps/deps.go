// Package deps pins the module's direct dependencies while the packages that
// use them are being written; it is removed once each is imported for real.
package deps

import (
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/robfig/cron/v3"
	_ "github.com/slack-go/slack"
	_ "github.com/stripe/stripe-go/v76"
	_ "github.com/stripe/stripe-go/v76/client"
	_ "go.uber.org/goleak"
	_ "golang.org/x/time/rate"
)
