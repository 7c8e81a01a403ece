"""hamid.scheduler"""
