"""Deploy the model server to a SageMaker real-time endpoint: `kokoro-deploy`."""
