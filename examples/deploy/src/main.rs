//! `expenses`: the expense agent behind every durafiber command — `serve`, `tokens`, `runs`,
//! `approvals`, `approve`, `send-event`, `cancel`, `alarms`, `store`, `backup`, `restore`.

mod expense;

fn main() {
    durafiber::cli::main(|builder| builder.agent(expense::Expense))
}
