//! `model-agent`: the model-calling agent behind every durafiber command. The model and the
//! tools come from the environment (see `durafiber_examples::model_agent`).

use durafiber_examples::model_agent::ModelAgent;

fn main() {
    let agent = match ModelAgent::from_env() {
        Ok(agent) => agent,
        Err(e) => {
            eprintln!("model-agent: {e}");
            std::process::exit(2);
        }
    };
    durafiber::cli::main(move |builder| builder.agent(agent.clone()))
}
