package chaos

// explained is each scenario in one sentence for someone who has not read
// the code: what goes wrong, why a naive consumer bills twice, and what
// pelguard does instead. The HTML report shows it beside the results.
var explained = map[string]string{
	ScenarioInflightReclaim: "A Stripe call takes longer than the monitor's min-idle, so the monitor hands the message that is still being charged " +
		"to a second worker, which charges the customer again; pelguard's lease, renewed while the call runs, keeps the message with its owner.",
	ScenarioPartialBatch: "A worker reads ten messages and is killed (or loses a reply) part-way through, before it acknowledges them; " +
		"a naive consumer charges the messages already paid again when they are read again, pelguard finds them in its ledger and only acknowledges them.",
	ScenarioAOFRollback: "Redis restarts without its last second of writes, so messages already charged and acknowledged come back as pending; " +
		"a naive consumer charges them again, pelguard's ledger in Postgres remembers they were billed.",
	ScenarioExpiredKey: "Messages whose charge went through but whose reply was lost come back after 25 hours, when Stripe no longer remembers " +
		"their idempotency key, so Stripe charges again; pelguard looks the charge up at Stripe and records it instead of charging.",
	ScenarioUsageInflightReclaim: "A meter-event call takes longer than min-idle and a second worker sends the same event again; without an identifier " +
		"Stripe counts the usage twice, pelguard's lease keeps the event with one worker.",
	ScenarioUsagePartialBatch: "Of a batch of ten meter events the 7th reply is lost and the whole batch is read again; a sender without an identifier " +
		"counts the events already sent twice, pelguard's ledger sends only what is left.",
	ScenarioUsageAOFRollback: "Redis restarts without its last writes and meter events already sent and acknowledged come back as pending; " +
		"without an identifier they are counted twice, pelguard's ledger knows they were sent.",
	ScenarioUsage25hGap: "Replies and acknowledgements are lost and the events come back 25 hours later, past Stripe's 24-hour window for " +
		"identifiers, so even a sender with an identifier has them counted twice; pelguard's ledger does not send them again.",
	ScenarioUsageBusyCustomer: "One customer sends hundreds of usage events a second beside many quiet customers while Stripe takes 100 ms per call; " +
		"senders that make one call per event fall further behind every second, the quiet customers' events queued behind the busy one's, " +
		"so invoices closed meanwhile under-bill everyone; pelguard records each event in its ledger at once and sends one call per customer " +
		"and second carrying that second's sum, so Stripe's count keeps up and every event is counted once.",
}

// Explain is the scenario in one sentence ("" for an unknown name).
func Explain(name string) string { return explained[name] }
