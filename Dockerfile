FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md beat_schedule.py ./
COPY orchestration ./orchestration
COPY tasks ./tasks
RUN pip install --no-cache-dir '.[postgres,flower,signing]'
RUN useradd --create-home orch
USER orch
ENV ORCH_DATABASE_URL=postgresql://orch:orch@postgres:5432/orchestration \
    ORCH_BROKER_URL=redis://redis:6379/0
